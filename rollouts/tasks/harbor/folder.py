"""Harbor / Terminal-Bench task folders as forge tasks.

A Harbor task is a folder (harbor-framework/harbor, `harbor/models/task/paths.py`):

    task.toml          [metadata], [verifier] timeout_sec/env, [agent] timeout_sec, [environment]
    instruction.md     what the agent is told
    environment/       Dockerfile (or docker_image in task.toml) and the files it COPYs
    tests/test.sh      run after the agent; writes /logs/verifier/reward.txt or reward.json
    solution/          solve.sh, the reference solution, and the files it uses (optional)

`harbor_record` turns one into the record `TaskSpec` validates: the instruction, the files the
agent starts with (those the Dockerfile COPYs into its WORKDIR), the agent's time limit, the
reference solution (`bash /solution/solve.sh` and all of solution/ as `solution_files`, which only the
reference run of `forge tasks validate --run` writes into its sandbox), `harbor` (rollouts/tasks/harbor/verifier.py: the tests, run only after the
agent is gone), and `limits`: the `[environment]` cpus / memory_mb / storage_mb it declares (Harbor's
deprecated "4G" forms too), which replace the run's sandbox limits for it (sandbox/limits.py). The `harbor` package parses task.toml with pydantic models, but it needs Python 3.12
(forge runs on 3.11): `HarborConfig` below is the subset of its `TaskConfig`
(`harbor/models/task/config.py`, harbor 0.26.0) forge reads, with the same names and defaults.

`[[environment.mcp_servers]]` (Harbor's MCPServerConfig, `HarborMcpServer`) become the task's
`mcp_servers` (rollouts/tasks/harbor/mcp.py): a stdio server runs on the host per rollout from the
environment/ files its image paths were COPYed from, its tools served to the agent through the
rollout's own tool server, every call recorded there; the COPY that brings only its files gives the
agent nothing.

What forge cannot run yet is refused here with one line per task, never run half-way: a Dockerfile
with steps other than FROM/WORKDIR/COPY/ADD of its own files and those that build nothing (RUN installs
software: `forge tasks import harbor` builds such a task into an image, rollouts/tasks/harbor/image.py,
and the task runs there on the Docker backend), MCP servers over HTTP (a compose service, or one
inside the agent's container), what of environment/docker-compose.yaml forge does not run
(rollouts/tasks/harbor/compose.py: services beside `main` run on the Docker backend, each reached by
its name), separate verifier environments, Windows and GPUs. A multi-step task (`[[steps]]`) keeps
its steps in `harbor_steps` (rollouts/tasks/harbor/steps.py): the first step's instruction, tests and
solution stand for the task's own, and the runner runs the rest in the same sandbox.
The base image is not pulled: the task runs with the sandbox's tools (the host's, on a local
sandbox), so a test.sh that needs a tool the host lacks ends as an infrastructure failure.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from openforge.rollouts.tasks.harbor.dockerfile import copied_files, copy_parts, final_workdir, traced_steps
from openforge.rollouts.tasks.harbor.compose import ServiceBuild, compose_services
from openforge.rollouts.tasks.harbor.mcp import HarborMcpServer, image_copies, mcp_server_records
from openforge.rollouts.tasks.harbor.steps import HarborSteps, harbor_steps
from openforge.rollouts.tasks.harbor.verifier import SOLUTION_DIR, HarborTests, rewrite_paths
from openforge.rollouts.tasks.setup_files import SetupLimits, read_task_file, task_tree

DEFAULT_AGENT_TIMEOUT_S = 600.0  # Harbor's [agent] timeout_sec has no default of its own
DEFAULT_WORKDIR = "/app"  # Terminal-Bench's images all work in /app
_INERT = {"ENV", "LABEL", "EXPOSE", "CMD", "ENTRYPOINT", "USER", "SHELL", "STOPSIGNAL", "HEALTHCHECK", "ARG",
          "MAINTAINER", "VOLUME", "ONBUILD"}


class _Section(BaseModel):
    model_config = ConfigDict(extra="allow")  # Harbor ignores fields it does not know; so does forge


class VerifierSection(_Section):
    timeout_sec: float = Field(600.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    environment: dict[str, Any] | None = None
    environment_mode: str | None = None


class AgentSection(_Section):
    timeout_sec: float | None = Field(None, gt=0)


class EnvironmentSection(_Section):
    docker_image: str | None = None
    os: str = "linux"
    # Harbor's defaults (1 core, 2048 MB, 10240 MB) are left out: a task that declares none keeps the run's limits.
    cpus: float | None = Field(None, gt=0)
    memory_mb: int | None = Field(None, ge=16)
    storage_mb: int | None = Field(None, ge=1)
    memory: str | None = None  # Harbor's deprecated "4G" / "512M" forms of memory_mb and storage_mb
    storage: str | None = None
    build_timeout_sec: float | None = Field(None, gt=0)
    gpus: int | None = None
    mcp_servers: list[HarborMcpServer] = Field(default_factory=list)
    workdir: str | None = None
    allow_internet: bool | None = None
    network_mode: str | None = None

    @model_validator(mode="after")
    def _sizes(self) -> "EnvironmentSection":
        """The deprecated size strings as Harbor maps them (`EnvironmentConfig.handle_deprecated_fields`)."""
        if self.memory is not None:
            self.memory_mb, self.memory = _size_mb(self.memory, "memory"), None
        if self.storage is not None:
            self.storage_mb, self.storage = _size_mb(self.storage, "storage"), None
        return self

    def limits(self) -> dict[str, float | int] | None:
        """The TaskSpec.limits record of what the task declares, None when it declares nothing."""
        declared = {"cpus": self.cpus, "memory_mb": self.memory_mb, "storage_mb": self.storage_mb}
        return {k: v for k, v in declared.items() if v is not None} or None


def _size_mb(size: str, name: str) -> int:
    """Harbor's `_parse_size_to_mb`: "4G" -> 4096, "512M" -> 512, "2048K" -> 2."""
    text = size.strip().upper()
    scale = {"G": 1024.0, "M": 1.0, "K": 1 / 1024}.get(text[-1:])
    try:
        if scale is None:
            raise ValueError
        return int(float(text[:-1]) * scale)
    except ValueError:
        raise ValueError(f"{name} = {size!r}: expected a size like '1G' or '512M'") from None


class HarborConfig(_Section):
    """task.toml: the parts forge uses of Harbor's TaskConfig (same names, same defaults)."""

    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: VerifierSection = Field(default_factory=VerifierSection)
    agent: AgentSection = Field(default_factory=AgentSection)
    environment: EnvironmentSection = Field(default_factory=EnvironmentSection)
    steps: list[dict[str, Any]] | None = None  # rollouts/tasks/harbor/steps.py reads them
    multi_step_reward_strategy: str | None = None


def is_harbor_task(folder: Path) -> bool:
    """Whether `folder` is a Harbor task (task.toml beside instruction.md, or beside steps/ for a multi-step
    task, which has no instruction of its own; forge's own task.toml holds its instruction)."""
    return (folder / "task.toml").is_file() and ((folder / "instruction.md").is_file() or (folder / "steps").is_dir())


def _read(path: Path, limits: SetupLimits = SetupLimits()) -> str:
    """One file of the task, read through the loaders' one check: a link out of its folder, a file past the
    limit is a ValueError (rollouts/tasks/setup_files.py)."""
    return read_task_file(path, path.parent, limits).decode("utf-8")


def _text_tree(root: Path, limits: SetupLimits = SetupLimits()) -> dict[str, str]:
    """Every file under `root` (relative POSIX path -> UTF-8 text); raises ValueError naming a bad one (a link
    out of `root`, one past `limits`: rollouts/tasks/setup_files.py)."""
    files: dict[str, str] = {}
    for f in task_tree(root, root, limits):
        rel = f.relative_to(root).as_posix()
        try:
            files[rel] = read_task_file(f, root, limits).decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{root.name}/{rel} is not UTF-8 text (binary task files are not supported yet)") from None
    return files


def local_environment(env_dir: Path, workdir: str | None, host_side: frozenset[str] = frozenset(),
                      limits: SetupLimits = SetupLimits()) -> tuple[str, dict[str, str]]:
    """(WORKDIR, the files the agent starts with relative to it) of a plain Dockerfile: FROM,
    WORKDIR, COPY/ADD of the task's own files into the WORKDIR, and steps that build nothing (ENV
    among them: the sandbox's environment is forge's). A COPY of only `host_side` files (image paths a
    stdio MCP server runs from, on the host: harbor/mcp.py) brings the agent nothing. Raises ValueError
    with the one-line reason otherwise."""
    dockerfile = env_dir / "Dockerfile"
    start = workdir or DEFAULT_WORKDIR
    steps = traced_steps(_read(dockerfile), start) if dockerfile.is_file() else []
    files: dict[str, str] = {}
    for step in steps:
        n, word, args, wd = step
        where = f"environment/Dockerfile line {n}"
        if word in ("FROM", "WORKDIR") or word in _INERT:
            continue
        if word in ("COPY", "ADD"):
            parsed = copy_parts(step)
            if parsed is None or any("://" in p for p in [*parsed[0], parsed[1]]):
                raise ValueError(f"{where}: {word} {args[:60]} fetches from outside the task (not supported)")
            srcs, dest = parsed
            if host_side and (brought := set(copied_files(env_dir, step))) and brought <= host_side:
                continue
            for src in srcs:
                files.update(_copied(env_dir, src, dest, wd, where, limits))
        else:  # RUN and anything else that builds software
            raise ValueError(f"{where}: {word} needs an image build: `forge tasks import harbor SRC --out DIR` "
                             "builds it with Docker (as read here, only FROM/WORKDIR/COPY/ENV Dockerfiles run, "
                             "with the sandbox's own tools)")
    return final_workdir(steps, start), files


def _copied(env_dir: Path, src: str, dest: str, wd: str, where: str, limits: SetupLimits) -> dict[str, str]:
    """The files one COPY brings, keyed by their path relative to the WORKDIR."""
    source = (env_dir / src).resolve()
    if not source.is_relative_to(env_dir.resolve()) or not source.exists():
        raise ValueError(f"{where}: COPY {src}: no such file in environment/")
    rel_dest = PurePosixPath(dest).relative_to(wd) if PurePosixPath(dest).is_relative_to(wd) else None
    if rel_dest is None:
        raise ValueError(f"{where}: COPY to {dest}, outside the WORKDIR {wd} (a local sandbox has only its "
                         "working directory)")
    if source.is_dir():
        return {str(rel_dest / p) if str(rel_dest) != "." else p: t for p, t in _text_tree(source, limits).items()}
    name = str(rel_dest / source.name) if dest.endswith("/") or str(rel_dest) == "." else str(rel_dest)
    return {name: read_task_file(env_dir / src, env_dir, limits).decode("utf-8")}


def _unsupported(config: HarborConfig, folder: Path) -> list[str]:
    env = config.environment
    reasons = []
    if config.steps and env.mcp_servers:
        reasons.append("multi-step tasks ([[steps]]) with [[environment.mcp_servers]] are not supported yet")
    if config.verifier.environment is not None or config.verifier.environment_mode == "separate":
        reasons.append("a separate verifier environment is not supported yet")
    if env.os.lower() != "linux":
        reasons.append(f"[environment] os = {env.os!r}: only linux tasks run")
    if env.gpus:
        reasons.append("[environment] gpus: sandboxes have no GPUs")
    if env.docker_image and not (folder / "environment" / "Dockerfile").is_file():
        reasons.append(f"[environment] docker_image = {env.docker_image!r}: forge does not pull images; "
                       "tasks run from an environment/Dockerfile")
    return reasons


def task_mcp_servers(folder: Path, config: HarborConfig) -> tuple[list[dict[str, Any]], frozenset[str], list[str]]:
    """(the TaskSpec.mcp_servers records of the task's [[environment.mcp_servers]], the image paths they run
    from, one line per server forge cannot run): rollouts/tasks/harbor/mcp.py."""
    if not config.environment.mcp_servers:
        return [], frozenset(), []
    env_dir = folder / "environment"
    dockerfile = env_dir / "Dockerfile"
    start = config.environment.workdir or DEFAULT_WORKDIR
    steps = traced_steps(_read(dockerfile), start) if dockerfile.is_file() else []
    # The server's relative paths are read from the final WORKDIR, as Harbor's exec runs in it.
    records, host_side, reasons = mcp_server_records(config.environment.mcp_servers, image_copies(env_dir, steps),
                                                     final_workdir(steps, start))
    if records:
        try:  # the server's folder on the host: the build context, as the image's COPYs read it
            context = _text_tree(env_dir)
        except ValueError as exc:
            return [], frozenset(), [f"[[environment.mcp_servers]]: its files: {exc}"]
        records = [{**r, "files": context} for r in records]
    return records, frozenset(host_side), reasons


def harbor_record(folder: Path, *, build: Callable[[HarborConfig], Any] | None = None,
                  build_service: ServiceBuild | None = None, limits: SetupLimits = SetupLimits(),
                  ) -> tuple[dict[str, Any] | None, list[str]]:
    """The TaskSpec record of the Harbor task in `folder`, or None and the reasons it cannot be one.
    A Dockerfile that builds something is handed to `build` (rollouts/tasks/harbor/image.py: it returns
    the TaskImage it was built into, or raises ImageBuildFailed) and the task runs in that image, its files
    already there; without `build`, the Dockerfile must build nothing. A compose service's `build` goes to
    `build_service` the same way (rollouts/tasks/harbor/compose.py)."""
    try:
        config = HarborConfig.model_validate(tomllib.loads(_read(folder / "task.toml")))
    except (OSError, UnicodeDecodeError) as exc:
        return None, [f"cannot read task.toml: {exc}"]
    except tomllib.TOMLDecodeError as exc:
        return None, [f"bad task.toml: {exc}"]
    except ValidationError as exc:
        return None, [f"task.toml: {'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
    except ValueError as exc:  # a link out of the folder, a file past the limits
        return None, [str(exc)]
    try:
        mcp_servers, host_side, mcp_reasons = task_mcp_servers(folder, config)
    except (OSError, UnicodeDecodeError) as exc:
        return None, [f"[[environment.mcp_servers]]: {exc}"]
    if reasons := _unsupported(config, folder) + mcp_reasons:
        return None, reasons
    compose, reasons = compose_services(folder / "environment", build_service)
    if reasons:
        return None, reasons
    script = folder / "tests" / "test.sh"
    if not script.is_file() and not config.steps:  # a multi-step task's steps may each bring their own
        return None, ["tests/test.sh: missing (Harbor's verifier writes the reward from it)"]
    try:
        tests = _text_tree(folder / "tests", limits) if (folder / "tests").is_dir() else {}
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return None, [str(exc)]
    agent_timeout_s = config.agent.timeout_sec or DEFAULT_AGENT_TIMEOUT_S

    def parse_steps(verifier: HarborTests, to_workdir: dict[str, str]) -> tuple[HarborSteps | None, list[str]]:
        return harbor_steps(folder, config.steps or [], config.multi_step_reward_strategy, shared_tests=tests,
                            verifier=verifier, to_workdir=to_workdir, text_tree=lambda root: _text_tree(root, limits),
                            agent_timeout_s=agent_timeout_s)

    # A step forge cannot run refuses the task before its image is built (a build can take minutes); the
    # steps are made again after it, with the WORKDIR the build gave (their paths are rewritten to it).
    if config.steps and (reasons := parse_steps(HarborTests(files=tests), {})[1]):
        return None, reasons
    image = None
    try:
        try:
            workdir, files = local_environment(folder / "environment", config.environment.workdir, host_side, limits)
        except ValueError:  # RUN, a COPY outside the WORKDIR, ...: the engine builds it, if there is one
            if build is None:
                raise
            image = build(config)
            workdir, files = image.workdir, {}
        instruction = _read(folder / "instruction.md") if not config.steps else ""
        # Harbor's oracle copies all of solution/ to /solution and runs /solution/solve.sh there.
        solution = _text_tree(folder / "solution", limits) if (folder / "solution" / "solve.sh").is_file() else None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return None, [str(exc)]
    to_workdir = {workdir.rstrip("/"): "."} if workdir.rstrip("/") else {}
    verifier = HarborTests(files=tests, timeout_s=config.verifier.timeout_sec, env=config.verifier.env, workdir=workdir)
    steps = None
    if config.steps:  # the first step's instruction, tests and solution stand for the task's own
        steps, reasons = parse_steps(verifier, to_workdir)
        if steps is None:
            return None, reasons
        first = steps.steps[0]
        instruction, verifier = first.instruction, first.tests
        solution = first.solution_files if all(s.solution_files for s in steps.steps) else None
    meta = config.metadata
    tags = ["harbor", *(str(t) for t in meta.get("tags", []) if isinstance(t, str))]
    if meta.get("category"):
        tags.append(str(meta["category"]))
    record: dict[str, Any] = {
        "id": folder.name,
        # The WORKDIR (/app) becomes the working directory the agent starts in: a local sandbox has no /app.
        "instruction": instruction if steps is not None else rewrite_paths(instruction, to_workdir),
        "files": files,
        "time_limit_s": config.agent.timeout_sec or DEFAULT_AGENT_TIMEOUT_S,
        "tags": tags,
        "requires_tools": True,
        "family": {"kind": "harbor", "tests": verifier.model_dump(),
                   **({"steps": steps.model_dump()} if steps is not None else {})},
    }
    if image is not None:
        record["image"] = image.model_dump()
    if mcp_servers:
        record["mcp_servers"] = mcp_servers
    if compose:
        record["compose"] = compose
    if limits := config.environment.limits():
        record["limits"] = limits
    difficulty = str(meta.get("difficulty", "")).lower()
    if difficulty in ("easy", "medium", "hard"):
        record["difficulty"] = difficulty
    if solution is not None:  # /solution and the WORKDIR are mapped into the sandbox by the reference run
        record["solution"], record["solution_files"] = f"bash {SOLUTION_DIR}/solve.sh", solution
    return record, []


# A line of a test script that fetches at grading time (Terminal-Bench's test.sh installs uv and pytest so).
# A URL's host with a dot (not localhost, a loopback address or a compose service's name) is off the machine.
_DOWNLOADS = re.compile(r"\b(curl|wget)\b.*\b(https?|ftp)://(?!localhost\b|127\.|0\.0\.0\.0)[\w-]+\.[A-Za-z]|"
                        r"\b(pip3?|uv\s+pip|uv\s+add|npm|yarn|pnpm|apt-get|apt|apk|"
                        r"gem|cargo)\s+(install|add)\b|\buvx\b|\bgit\s+clone\b|\bgo\s+(get|install)\b")
# What a download that found no network leaves in its output (curl, apt, pip, Python, git, Rust's tools).
_OFFLINE = re.compile(r"could not resolve (host|proxy)|temporary failure (in name resolution|resolving)|"
                      r"name or service not known|getaddrinfo|failed to establish a new connection|"
                      r"network is unreachable|unable to locate package|no matching distribution found|"
                      r"failed to fetch|urlopen error|could not connect to|dns error|error sending request", re.I)


def grading_downloads(tests: dict[str, str]) -> list[str]:
    """The lines of a task's test scripts that download when the tests run ("tests/test.sh line 2: curl ..."):
    offline (forge's sandboxes have no network) they fail, and with them the grading."""
    return [f"tests/{name} line {n}: {line.strip()[:120]}" for name, text in sorted(tests.items())
            if name.endswith(".sh") for n, line in enumerate(text.splitlines(), 1)
            if not line.lstrip().startswith("#") and _DOWNLOADS.search(line)]


def offline_failure(output: str) -> str | None:
    """The first line of `output` saying a download found no network (a failed host lookup, ...), or None."""
    return next((line.strip()[:200] for line in output.splitlines() if _OFFLINE.search(line)), None)


_DATASET_HINT = re.compile(r"^harbor:", re.I)


def strip_prefix(path: str) -> str | None:
    """`harbor:SRC` (a task set path naming the format) -> SRC; None for any other path."""
    return _DATASET_HINT.sub("", path, count=1) if _DATASET_HINT.match(path) else None
