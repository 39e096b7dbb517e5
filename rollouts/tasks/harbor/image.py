"""A Harbor task's environment/Dockerfile built into a forge sandbox image, offline, with the real engine.

    bases = parse_base_map(["ubuntu:24.04=my-ubuntu-with-tools"])
    image = build_task_image(folder, "/app", bases=bases)   # TaskImage(tag, workdir), cached by content
    record, reasons = harbor_record(folder, build=...)      # calls it when the Dockerfile builds something

`forge tasks import harbor SRC --out DIR [--base FROM=IMAGE ...]` calls this for every task whose
Dockerfile builds something (RUN). The build is the docker SDK's (`images.build`, the engine's own
builder) with `network_mode = "none"` and nothing pulled: each FROM must name an image the engine
already holds, after `--base` mapped it (a task's `FROM ubuntu:24.04` onto a local image that has
what its steps would download). A step that fails (most often one that downloads) is one line naming
its Dockerfile line, the step and the way out: a local base that already holds what it fetches.
A compose service's `build` (rollouts/tasks/harbor/compose.py) is built the same way, without forge's
layer (`build_service_image`: a service runs as its image says; the agent never execs in it).
A task's `[environment] build_timeout_sec` bounds its build (sandbox/timed_build.py): past it the build
is stopped, nothing is tagged, its step's container is removed, and the task is refused in one line.

forge's own layer goes last: the sandbox's user (uid/gid 1000, `forge`, as every sandbox image has,
sandbox/container_images.py) owning /home/forge and the WORKDIR, so a container of it runs as the Docker
backend runs every container (root read-only, those folders writable). The tag is a hash of what
the build reads (the Dockerfile as built, every file of the build context, the base images' ids):
an unchanged task is never built twice, a changed file or a re-mapped base builds anew.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from openforge.errors import TaskError
from openforge.rollouts.tasks.harbor.dockerfile import dockerfile_lines
from openforge.sandbox.container_images import SANDBOX_HOME, SANDBOX_UID
from openforge.sandbox.timed_build import BuildTimedOut, build_image

REPOSITORY = "openforge-harbor"
RECIPE_VERSION = 1  # bump when forge's layer below changes
BUILD_DOCKERFILE = ".forge.Dockerfile"  # written into a copy of the build context, never into the task
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP = re.compile(r"^Step (\d+)/(\d+) : ")
_HEREDOC = re.compile(r"(?<!<)<<-?\s*(['\"]?)[A-Za-z_]\w*\1")  # `RUN python3 << 'PY'`, not `<<<` here-strings


class TaskImage(BaseModel):
    """The sandbox image a task runs in (TaskSpec.image) and its working directory there."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tag: str = Field(min_length=1, description="a Docker image the engine holds (built by `forge tasks import harbor`)")
    workdir: str = Field("/app", description="the image's working directory: the agent's and the tests'")


class ImageBuildFailed(TaskError):
    """A task's environment could not be built offline: the line says which step and what to do."""


def parse_base_map(items: list[str]) -> dict[str, str]:
    """`["ubuntu:24.04=my-image", ...]` -> {"ubuntu:24.04": "my-image"}; TaskError for a malformed one."""
    bases = {}
    for item in items:
        name, sep, local = item.partition("=")
        if not sep or not name.strip() or not local.strip():
            raise TaskError(f"--base {item!r}: expected FROM=IMAGE (a base image a task names = a local image)")
        bases[name.strip()] = local.strip()
    return bases


def _tag(task_id: str, digest: str) -> str:
    slug = re.sub(r"[^a-z0-9_.-]+", "-", task_id.lower()).strip(".-")[:80] or "task"
    return f"{REPOSITORY}:{slug}-{digest[:12]}"


def _context_digest(env_dir: Path) -> list[tuple[str, str]]:
    return [(p.relative_to(env_dir).as_posix(), hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(env_dir.rglob("*")) if p.is_file()]


def _forge_layer(workdir: str) -> str:
    """The sandbox's user and its folders, whatever the task's base holds (Debian's useradd or not)."""
    uid = SANDBOX_UID
    return (f"USER 0\n"
            f"RUN grep -q '^[^:]*:[^:]*:{uid}:' /etc/passwd || echo 'forge:x:{uid}:{uid}:forge:{SANDBOX_HOME}:/bin/sh' "
            f">> /etc/passwd; grep -q '^[^:]*:[^:]*:{uid}:' /etc/group || echo 'forge:x:{uid}:' >> /etc/group; "
            f"mkdir -p {SANDBOX_HOME} {workdir} && chown -R {uid}:{uid} {SANDBOX_HOME} {workdir}\n"
            f"WORKDIR {workdir}\n")


def _prepare(text: str, bases: dict[str, str], client: Any, default_workdir: str, *, layer: bool = True
             ) -> tuple[list[tuple[int, str, str]], str, str, dict[str, str]]:
    """(the task's steps, the Dockerfile to build with FROMs mapped (and forge's sandbox layer, with `layer`),
    the final WORKDIR, {base: image id})."""
    import docker.errors

    steps = dockerfile_lines(text)
    if not any(word == "FROM" for _, word, _ in steps):
        raise ImageBuildFailed("environment/Dockerfile: no FROM")
    stages: set[str] = set()
    out, ids, workdir = [], {}, default_workdir
    for n, word, args in steps:
        if word == "FROM":
            words = [w for w in args.split() if not w.startswith("--")]
            if not words:
                raise ImageBuildFailed(f"environment/Dockerfile line {n}: FROM names no image")
            name = words[0]
            if len(words) >= 3 and words[1].upper() == "AS":
                stages.add(words[2].lower())
            workdir = default_workdir
            if name.lower() not in stages and name != "scratch":
                local = bases.get(name, name)
                if "$" in local:
                    raise ImageBuildFailed(f"environment/Dockerfile line {n}: FROM {name} takes a build argument; "
                                           f"map it to a local image: --base {name}=IMAGE")
                try:
                    ids[local] = client.images.get(local).id
                except docker.errors.ImageNotFound:
                    mapped = f" (mapped from {name})" if local != name else ""
                    raise ImageBuildFailed(
                        f"environment/Dockerfile line {n}: FROM {local}{mapped} is not on this machine and forge builds "
                        f"offline (nothing is pulled): `docker load` it, or map it to a local image with "
                        f"--base {name}=IMAGE (forge's own: `forge sandbox build-image`)") from None
                args = " ".join(local if w == name else w for w in args.split())
        elif word == "WORKDIR":
            workdir = args if args.startswith("/") else f"{workdir.rstrip('/')}/{args}"
        elif word in ("RUN", "COPY") and _HEREDOC.search(args):
            raise ImageBuildFailed(f"environment/Dockerfile line {n}: {word} {args[:60]} is a heredoc (BuildKit syntax); "
                                   "forge builds with the engine's classic builder (the docker SDK), which does not "
                                   "read heredocs: move its text into a file the Dockerfile COPYs")
        out.append(f"{word} {args}")
    return steps, "\n".join(out) + "\n" + (_forge_layer(workdir) if layer else ""), workdir, ids


def build_task_image(folder: Path, default_workdir: str, *, bases: dict[str, str] | None = None,
                     client: Any = None, timeout_s: float | None = None) -> tuple[TaskImage, bool]:
    """(the task's image, whether it was built now): built from `folder/environment/Dockerfile` with no
    network, or found by its content hash. ImageBuildFailed (one line) when it cannot be built offline
    or within `timeout_s` (the task's [environment] build_timeout_sec; sandbox/timed_build.py stops it)."""
    env_dir = folder / "environment"
    own = client is None
    client = client or _connect()
    try:
        text = (env_dir / "Dockerfile").read_text(encoding="utf-8")
        steps, dockerfile, workdir, ids = _prepare(text, bases or {}, client, default_workdir)
        recipe = {"v": RECIPE_VERSION, "dockerfile": dockerfile, "bases": ids, "context": _context_digest(env_dir)}
        tag = _tag(folder.name, hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest())
        built = _build_once(client, env_dir, dockerfile, tag, steps, where="environment/Dockerfile",
                            labels={"openforge.harbor.task": folder.name}, timeout_s=timeout_s,
                            timeout_hint=" (no image tagged, its containers removed); a longer build needs a larger "
                                         "build_timeout_sec in task.toml")
        return TaskImage(tag=tag, workdir=workdir), built
    finally:
        if own:
            client.close()


def build_service_image(folder: Path, service: str, context: Path, dockerfile: str, *,
                        bases: dict[str, str] | None = None, client: Any, timeout_s: float | None = None
                        ) -> tuple[str, bool]:
    """(the tag of a compose service's image, whether it was built now): its `build` folder built as the task's
    own image is (offline, FROMs local or mapped, cached by content), without forge's sandbox layer: a
    service runs as its image says, the agent never execs in it."""
    where = f"compose service {service}: {context.relative_to(folder.resolve()).as_posix()}/{dockerfile}"
    try:
        text = (context / dockerfile).read_text(encoding="utf-8")
        steps, built_file, _, ids = _prepare(text, bases or {}, client, "/", layer=False)
    except (OSError, UnicodeDecodeError) as exc:
        raise ImageBuildFailed(f"{where}: cannot read it: {exc}") from None
    except ImageBuildFailed as exc:
        raise ImageBuildFailed(f"{where}{str(exc).removeprefix('environment/Dockerfile')}") from None
    recipe = {"v": RECIPE_VERSION, "service": service, "dockerfile": built_file, "bases": ids,
              "context": _context_digest(context)}
    tag = _tag(f"{folder.name}-{service}", hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest())
    return tag, _build_once(client, context, built_file, tag, steps, where=where, timeout_s=timeout_s,
                            labels={"openforge.harbor.task": folder.name, "openforge.harbor.service": service})


def _build_once(client: Any, source: Path, dockerfile: str, tag: str, steps: list[tuple[int, str, str]], *,
                where: str, labels: dict[str, str], timeout_s: float | None, timeout_hint: str = "") -> bool:
    """Build `dockerfile` over a copy of the folder `source` as `tag`, offline, unless the engine already holds
    `tag` (tags are content hashes); whether it built. A failure is one ImageBuildFailed line starting `where`."""
    import docker.errors

    try:
        client.images.get(tag)
        return False
    except docker.errors.ImageNotFound:
        pass
    with tempfile.TemporaryDirectory(prefix="forge-harbor-build-") as tmp:
        context = Path(tmp) / "context"
        shutil.copytree(source, context, symlinks=True)
        (context / BUILD_DOCKERFILE).write_text(dockerfile, encoding="utf-8")
        try:
            build_image(client, timeout_s=timeout_s, path=str(context), dockerfile=BUILD_DOCKERFILE, tag=tag,
                        network_mode="none", pull=False, rm=True, forcerm=True, labels=labels)
        except BuildTimedOut:
            raise ImageBuildFailed(f"{where}: the build ran past [environment] build_timeout_sec = {timeout_s:g}s "
                                   f"and was stopped{timeout_hint}") from None
        except docker.errors.BuildError as exc:  # _build_failure's line names environment/Dockerfile: `where` instead
            raise ImageBuildFailed(f"{where}{_build_failure(steps, exc).removeprefix('environment/Dockerfile')}"
                                   ) from None
        except docker.errors.APIError as exc:
            raise ImageBuildFailed(f"{where}: the engine refused it: {exc.explanation or exc}") from None
    return True


def _build_failure(steps: list[tuple[int, str, str]], exc: Any) -> str:
    """One line from the engine's build log: which of the task's steps failed, its last output, and what
    failed: a command the base lacks (exit 127), the network (a download's error in the log), or the step."""
    from openforge.rollouts.tasks.harbor.folder import offline_failure

    step, output, code = 0, "", None
    for entry in exc.build_log:
        chunk = _ANSI.sub("", str(entry.get("stream") or ""))
        if match := _STEP.match(chunk):
            step, output = int(match.group(1)), ""
        elif chunk.strip() and not chunk.startswith((" ---> ", "Removing intermediate")):
            output = chunk.strip().splitlines()[-1]
        code = (entry.get("errorDetail") or {}).get("code", code)
    why = f"exit {code}" if code is not None else (str(exc.msg or "it failed").strip().splitlines() or [""])[-1][:200]
    tail = f"; last output: {output[:200]}" if output else ""
    if not 1 <= step <= len(steps):  # forge's own layer: the base has no sh, grep or chown
        return f"environment/Dockerfile: forge's sandbox layer (uid {SANDBOX_UID}, {SANDBOX_HOME}) failed on this base: {why}{tail}"
    n, word, args = steps[step - 1]
    base = next((a.split()[0] for _, w, a in reversed(steps[:step]) if w == "FROM"), "BASE")
    if code == 127 or re.search(r"\bnot found\b", output):  # the shell found no such program: not the network
        return (f"environment/Dockerfile line {n}: {word} {args[:120]} failed in forge's offline build: a command it "
                f"runs is not in the base image: {why}{tail}. Map the task's base to an image that has it with "
                f"--base {base}=IMAGE")
    if not any(offline_failure(str(entry.get("stream") or "")) for entry in exc.build_log):
        return f"environment/Dockerfile line {n}: {word} {args[:120]} failed in forge's offline build: {why}{tail}"
    return (f"environment/Dockerfile line {n}: {word} {args[:120]} failed in forge's offline build (no network): "
            f"{why}{tail}. A step that downloads needs a base that already holds what it fetches: build or "
            f"load such an image and map the task's base to it with --base {base}=IMAGE")


@dataclass
class HarborImport:
    """What `forge tasks import harbor` made of a set: records to write, and each task's fate."""

    tasks: list[dict[str, Any]] = field(default_factory=list)
    built: list[str] = field(default_factory=list)  # images built now
    cached: list[str] = field(default_factory=list)  # images found by their content hash
    refused: list[tuple[str, str]] = field(default_factory=list)  # (task id, one line)
    notes: list[tuple[str, str]] = field(default_factory=list)  # (task id, one line): imported, but see why


def import_harbor(src: str | Path, *, bases: dict[str, str] | None = None) -> HarborImport:
    """Every Harbor task under `src` (a dataset folder or one task) as a forge task record: a Dockerfile
    that builds nothing as today (its COPYs become the task's files), any other built into an image."""
    from openforge.rollouts.tasks.harbor.folder import (DEFAULT_WORKDIR, HarborConfig, grading_downloads, harbor_record,
                                                 is_harbor_task)

    root = Path(src).expanduser()
    # Every folder with a task.toml is a task: one forge cannot run is refused by name, not passed over.
    if (root / "task.toml").is_file():
        folders = [root]
    elif root.is_dir():
        folders = sorted(p for p in root.iterdir() if p.is_dir() and (p / "task.toml").is_file())
    else:
        folders = []
    if not folders:
        raise TaskError(f"{src}: no Harbor task folders here (task.toml beside instruction.md)")
    report, client = HarborImport(), None
    try:
        for folder in folders:
            if not is_harbor_task(folder):
                report.refused.append((folder.name, "no instruction.md (nor steps/) beside task.toml"))
                continue

            def build(config: HarborConfig, folder: Path = folder) -> TaskImage:
                nonlocal client
                client = client or _connect()
                image, built = build_task_image(folder, config.environment.workdir or DEFAULT_WORKDIR, bases=bases,
                                                client=client, timeout_s=config.environment.build_timeout_sec)
                (report.built if built else report.cached).append(image.tag)
                return image

            def build_service(service: str, context: Path, dockerfile: str, folder: Path = folder) -> str:
                nonlocal client
                client = client or _connect()
                config = HarborConfig.model_validate(tomllib.loads((folder / "task.toml").read_text("utf-8")))
                tag, built = build_service_image(folder, service, context, dockerfile, bases=bases, client=client,
                                                 timeout_s=config.environment.build_timeout_sec)
                (report.built if built else report.cached).append(tag)
                return tag

            try:
                record, reasons = harbor_record(folder, build=build, build_service=build_service)
            except ImageBuildFailed as exc:
                report.refused.append((folder.name, str(exc)))
                continue
            if record is None:
                report.refused.append((folder.name, "; ".join(reasons)))
                continue
            report.tasks.append(record)
            if downloads := grading_downloads(record["family"]["tests"]["files"]):
                report.notes.append((folder.name, f"its tests download at grading time ({'; '.join(downloads[:2])}"
                                                  f"{'; ...' if len(downloads) > 2 else ''}): an offline sandbox "
                                                  "cannot grade it"))
    finally:
        if client is not None:
            client.close()
    return report


def _connect() -> Any:
    from openforge.errors import SandboxError
    from openforge.sandbox.docker_engine import connect

    try:
        return connect(timeout=3600)  # a build's steps may stay silent for a long time
    except SandboxError as exc:
        raise ImageBuildFailed(f"building its environment needs Docker: {exc}") from None
