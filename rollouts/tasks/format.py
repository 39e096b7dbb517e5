"""The task format: what an agent is asked to do, what its sandbox starts with, and how it is scored.

A task set is a JSONL file (one task per line) or a folder holding any mix of:

    easy.jsonl            one task per line
    make-config.json      one task per file (.json or .toml)
    fix-script/           one task per sub-folder: task.json or task.toml, plus optional
        task.toml         files/ (copied into the sandbox as setup files, byte-exact: text or binary) and
        files/run.sh      verifier/ (written only after the agent stops, so it cannot read them)

A folder whose task folders hold `task.toml` beside `instruction.md` is a Harbor / Terminal-Bench
dataset (rollouts/tasks/harbor/folder.py; `harbor:PATH` names the format outright): each task's tests run
after the agent is gone and its reward file is the reward (rollouts/tasks/harbor/verifier.py).

`builtin` names the set shipped in `rollouts/tasks/builtin/`; `builtin-web` the GUI set of
`rollouts/tasks/web/tasks/` (a web payload's `gui`: a site served on the host, graded by its state);
`arith-say-train`, `arith-say-heldout`, `arith-file-train`, `arith-file-heldout` the generated arithmetic
family of `rollouts/tasks/arith/` (disjoint train and held-out splits, for a real model's stage table).

A task is graded after the agent has stopped (and everything it started has been killed), by
either or both of:

- `expect_answer` / `expect_files`: exact checks the runner does itself on the harness's final answer
  and on files read out of the sandbox (rollouts/tasks/grading.py). Nothing in the sandbox can sway them.
- `verifier`: a shell command run in the sandbox's working directory. It fails (0.0) when it exits
  non-zero; when it exits 0, a last stdout line `score: X` (or a bare number, X in [0, 1]) is the
  reward, else 1.0. The harness's final answer is in `ANSWER_FILE` for it to read.
- `expect_requests`: exact rules on the record forge's fronts kept of the requests the task's
  `services` received (rollouts/tasks/services.py): mock APIs started on the host for each rollout.

With both, the reward is the verifier's when every expectation holds, else 0.0.

A task of a family (Harbor, OSWorld, ClawEval, desktop, web) carries that family's own part in `family`, one
payload keyed by `kind`, validated with the model that family's kind names (`payload_model`, each in its
family's folder, `rollouts/tasks/<kind>/payload.py`; a family from another package brings its own: registry.py).
A `kind` no installed family has is a problem of that task naming the family and how to install it. Records
of the older form, with those parts as top-level keys, load into it (`legacy_family`).

A `judge` component (rollouts/tasks/judge.py) adds a model's verdict or score, weighed beside the exact
graders' reward (or alone, in a task without them); a judge that fails makes the rollout an
infrastructure failure, never a 0.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, SerializeAsAny, ValidationError, field_validator, \
    model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from openforge.errors import TaskError
from openforge.rollouts.harnesses.agent_files import ANSWER_FILE
from openforge.rollouts.tasks.grading import ExpectedAnswer, check_relative_paths
from openforge.rollouts.tasks.harbor.folder import harbor_record, is_harbor_task, strip_prefix
from openforge.rollouts.tasks.harbor.image import TaskImage
from openforge.rollouts.tasks.judge import JudgeSpec
from openforge.rollouts.tasks.mcp_servers import McpServerSpec
from openforge.rollouts.tasks.payload import FamilyPayload
from openforge.rollouts.tasks.registry import payload_model
from openforge.rollouts.tasks.services import RequestRule, ServiceSpec
from openforge.rollouts.tasks.setup_files import FILES_DIR, SetupLimits, check_inside, decode, read_tree
from openforge.rollouts.tasks.tools import TaskTool, check_unique
from openforge.rollouts.tasks.web import WEB_TASKS_DIR
from openforge.sandbox.compose import ComposeService
from openforge.sandbox.limits import TaskLimits

BUILTIN_DIR = Path(__file__).parent / "builtin"
ARITH_DIR = Path(__file__).parent / "arith"
# The task sets forge ships, by name: `--tasks builtin`, `--tasks arith-say-heldout`, ...
NAMED_SETS: dict[str, Path] = {"builtin": BUILTIN_DIR, "builtin-web": WEB_TASKS_DIR} | {
    f"arith-{split}": ARITH_DIR / f"{split}.jsonl" for split in ("say-train", "say-heldout", "file-train", "file-heldout")}
_NO_GRADER = ("verifier: missing (required unless expect_answer, expect_files, expect_requests (a rule that is not "
              "only a gate), harbor, osworld or judge grades the task)")
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

P = TypeVar("P", bound=FamilyPayload)
# Task files written before `family` held each family's part as top-level keys: key -> (kind, name in the payload).
LEGACY_KEYS: dict[str, tuple[str, str]] = {
    "harbor": ("harbor", "tests"), "harbor_steps": ("harbor", "steps"), "osworld": ("osworld", "evaluator"),
    "claweval": ("claweval", "grading"), "gui": ("web", "gui"), "online": ("web", "online"),
    "desktop": ("desktop", "desktop")}


def family_payload(value: Any) -> FamilyPayload:
    """`family` validated with the model its `kind`'s family names (registry.py `payload_model`), as a tagged
    union is: errors located under the kind (`family.harbor.tests: ...`). A kind no installed family has is one
    error naming it and how to install it; nothing of the payload is dropped or guessed."""
    kind = value.kind if isinstance(value, FamilyPayload) else value.get("kind") if isinstance(value, dict) else None
    if not isinstance(kind, str):
        raise PydanticCustomError("family_kind", "a family payload is an object whose `kind` names the task's family")
    try:
        model = payload_model(kind)
    except TaskError as exc:
        raise PydanticCustomError("unknown_family", str(exc)) from None
    if isinstance(value, model):  # built by its family's code: taken as it is, as pydantic takes a model instance
        return value
    if isinstance(value, FamilyPayload):
        value = value.model_dump()
    try:
        return model.model_validate(value)
    except ValidationError as exc:  # re-located under the kind, each error as it was said
        raise ValidationError.from_exception_data(exc.title, [
            InitErrorDetails(type=PydanticCustomError(e["type"], e["msg"]), loc=(kind, *e["loc"]), input=e["input"])
            for e in exc.errors()]) from None


# A task family's own part of a task, keyed by `kind` as the sandbox config is keyed by `type` (openforge/config.py):
# its model is its family's, found by the kind's name; it is written out as that model (SerializeAsAny).
Family = Annotated[SerializeAsAny[FamilyPayload], PlainValidator(family_payload)]


def legacy_family(record: dict[str, Any]) -> dict[str, Any]:
    """`record` with its family's top-level keys of the older form (`harbor`, `osworld`, `gui`, ...) moved into
    one `family` payload; a record without them as it is. ValueError when they name two families."""
    if not any(key in record for key in LEGACY_KEYS):
        return record
    old = {k: record[k] for k in LEGACY_KEYS if record.get(k) is not None}  # a stored record wrote null for the rest
    out = {k: v for k, v in record.items() if k not in LEGACY_KEYS}
    if not old:
        return out
    if out.get("family") is not None:
        raise ValueError(f"family: given with the older keys {', '.join(sorted(old))} (write one form)")
    kinds = {LEGACY_KEYS[k][0] for k in old}
    if kinds == {"osworld", "desktop"}:  # an OSWorld-format task runs on a desktop: its payload holds it
        kinds = {"osworld"}
    elif "desktop" in kinds and "web" in kinds:
        raise ValueError("desktop: a desktop task has no site and no start page (gui, online)")
    if len(kinds) > 1:
        raise ValueError(f"{', '.join(sorted(old))}: a task is of one family")
    (kind,) = kinds
    out["family"] = {"kind": kind, **{LEGACY_KEYS[k][1]: v for k, v in old.items()}}
    return out


class TaskSpec(BaseModel):
    """One task. Paths in `files`/`verifier_files` are relative to the sandbox's working directory."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(description="unique within the set: letters, digits, . _ -")
    instruction: str = Field(min_length=1, description="what the agent is told")
    files: dict[str, str] = Field(default_factory=dict, description="setup files: path -> content")
    binary_files: dict[str, str] = Field(default_factory=dict, description=(
        "setup files that are not UTF-8 text (an image, a PDF, a database): path -> base64 of the bytes; a task "
        "folder's files/ fills it from the files themselves (rollouts/tasks/setup_files.py)"))
    setup: str | None = Field(None, description="shell command run before the agent starts")
    verifier: str | None = Field(None, min_length=1, description="shell command run after the agent stops")
    expect_answer: ExpectedAnswer | None = Field(None, description="the final answer, checked exactly by the runner")
    expect_files: dict[str, str] = Field(default_factory=dict, description="path -> exact content, checked by the runner")
    verifier_files: dict[str, str] = Field(default_factory=dict, description="written just before the verifier")
    time_limit_s: float = Field(120.0, gt=0, le=86400, description="the agent's wall-clock budget")
    pass_threshold: float = Field(1.0, ge=0, le=1, description="reward at or above this counts as a pass")
    difficulty: Literal["easy", "medium", "hard"] | None = None
    tags: list[str] = Field(default_factory=list)
    solution: str | None = Field(None, description="a reference solution (shell); never shown to the agent")
    solution_files: dict[str, str] = Field(default_factory=dict, description=(
        "the reference solution's own folder (Harbor's solution/): path -> content, written to $HOME/solution "
        "for the reference run of `forge tasks validate --run` only, `/solution` in them and in `solution` "
        "pointing there (rollouts/tasks/selfcheck.py); never in an agent's sandbox"))
    checkpoints: list[str] = Field(default_factory=list, description=(
        "named steps of a multi-step task; the verifier prints `checkpoint NAME: ok` for each one reached "
        "(forge analyze's plan completion)"))
    requires_tools: bool | None = Field(None, description=(
        "whether the task cannot be done without tools (default: when it has setup files); an answer "
        "with no tool call counts as a give-up in forge analyze"))
    image: TaskImage | None = Field(None, description=(
        "the sandbox image the task runs in, instead of sandbox.image (a Harbor environment built by `forge "
        "tasks import harbor`, rollouts/tasks/harbor/image.py); the Docker backend runs it, others refuse"))
    compose: list[ComposeService] = Field(default_factory=list, description=(
        "services started beside the agent's container, each reached by its name (a Harbor task's "
        "docker-compose.yaml services): the Docker backend runs them per rollout (sandbox/compose.py), the Kubernetes "
        "backend as containers of the rollout's pod, the local backend refuses"))
    limits: TaskLimits | None = Field(None, description=(
        "the task's own cpus / memory_mb / storage_mb (Harbor's [environment]): they replace the run's sandbox "
        "limits for its rollouts, as each backend can honour them (sandbox/limits.py)"))
    family: Family | None = Field(None, description=(
        "the task's family's own part, keyed by `kind`: harbor (tests, steps), osworld (evaluator, desktop), "
        "claweval (grading), desktop (desktop), web (gui or online); each model in its family's folder "
        "(rollouts/tasks/<kind>/payload.py). Records of the older form, with these as top-level keys (`harbor`, "
        "`osworld`, `gui`, ...), load into it"))
    judge: JudgeSpec | None = Field(None, description=(
        "a model that grades the answer and named files by a rubric after the agent is gone, weighed "
        "beside the exact graders (rollouts/tasks/judge.py)"))
    tools: list[TaskTool] = Field(default_factory=list, description=(
        "tools the agent gets through an MCP server the runner serves per rollout on the host, every "
        "dispatch recorded there (rollouts/tasks/tools.py)"))
    services: list[ServiceSpec] = Field(default_factory=list, description=(
        "mock APIs started on the host for each rollout, every request recorded there "
        "(rollouts/tasks/services.py)"))
    expect_requests: list[RequestRule] = Field(default_factory=list, description=(
        "exact rules on the services' record: a request made (or never made), checked by the runner"))
    mcp_servers: list[McpServerSpec] = Field(default_factory=list, description=(
        "the task's own MCP servers (Harbor's [[environment.mcp_servers]]): their tools reach the agent "
        "through the runner's tool server, every call recorded there (rollouts/tasks/mcp_servers.py)"))

    @model_validator(mode="before")
    @classmethod
    def _older_form(cls, data: Any) -> Any:
        return legacy_family(data) if isinstance(data, dict) else data

    @field_validator("id")
    @classmethod
    def _check_id(cls, value: str) -> str:
        if not _ID_RE.match(value):
            raise ValueError("must be 1-128 of letters, digits, '.', '_', '-' (starting with a letter or digit)")
        return value

    @field_validator("files", "verifier_files", "expect_files", "solution_files")
    @classmethod
    def _check_paths(cls, value: dict[str, str]) -> dict[str, str]:
        check_relative_paths(value, "the working directory")
        return value

    @field_validator("binary_files")
    @classmethod
    def _check_binary(cls, value: dict[str, str]) -> dict[str, str]:
        check_relative_paths(value, "the working directory")
        for path, content in value.items():
            decode(content, path)
        return value

    @field_validator("tools")
    @classmethod
    def _unique_tools(cls, value: list[TaskTool]) -> list[TaskTool]:
        return check_unique(value)

    @field_validator("mcp_servers")
    @classmethod
    def _unique_servers(cls, value: list[McpServerSpec]) -> list[McpServerSpec]:
        return check_unique(value, "MCP server")

    @field_validator("verifier", "instruction")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be blank")
        return value

    @property
    def exact_graded(self) -> bool:
        """Whether any exact grader (not a judge) scores the task. A `gate` rule scores nothing: it can only
        make the reward 0 (a safety check held is no work done), so gates alone grade no task."""
        return self.verifier is not None or self.expect_answer is not None or bool(self.expect_files) or \
            (self.family is not None and self.family.exact_graded) or any(not r.gate for r in self.expect_requests)

    @model_validator(mode="after")
    def _graded(self) -> "TaskSpec":
        if not self.exact_graded and self.judge is None:
            raise ValueError(_NO_GRADER)
        if both := sorted(set(self.files) & set(self.binary_files)):
            raise ValueError(f"binary_files: {', '.join(both)} also in files (a setup file is text or binary)")
        names = [s.name for s in self.services]
        if len(set(names)) != len(names):
            raise ValueError(f"services: duplicate name in {names}")
        if unknown := sorted({r.service for r in self.expect_requests} - set(names)):
            raise ValueError(f"expect_requests: no service named {', '.join(unknown)} (services: {names or 'none'})")
        if unknown := sorted({m.service for m in self.mcp_servers if m.service} - set(names)):
            raise ValueError(f"mcp_servers: no service named {', '.join(unknown)} (services: {names or 'none'})")
        return self

    def payload(self, cls: type[P]) -> P | None:
        """The family payload when it is a `cls` (`task.payload(HarborPayload)`), else None."""
        return self.family if isinstance(self.family, cls) else None

    def setup_files(self) -> dict[str, bytes]:
        """Every setup file's bytes, text and binary, as the runner writes them into the sandbox."""
        return {**{p: c.encode("utf-8") for p, c in self.files.items()},
                **{p: decode(c, p) for p, c in self.binary_files.items()}}

    def to_record(self) -> dict[str, Any]:
        """The JSON-ready dict the store keeps (Store.add_tasks wants `id` and `instruction`)."""
        return self.model_dump(mode="json")


@dataclass(frozen=True)
class TaskProblem:
    """One reason a task set is bad. `where` is `file` or `file:line`."""

    where: str
    task_id: str | None
    message: str

    def __str__(self) -> str:
        who = f" [{self.task_id}]" if self.task_id else ""
        return f"{self.where}{who}: {self.message}"


# ---------------------------------------------------------------------------------------------
# Reading raw task records (dicts) from files, with every problem collected rather than raised.


def _jsonl_records(path: Path, problems: list[TaskProblem]) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(TaskProblem(str(path), None, f"cannot read: {exc}"))
        return out
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("//"):
            continue
        where = f"{path}:{n}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(TaskProblem(where, None, f"bad JSON line {n}: {exc.msg} (column {exc.colno})"))
            continue
        if not isinstance(record, dict):
            problems.append(TaskProblem(where, None, f"line {n} is a JSON {type(record).__name__}, not an object"))
            continue
        out.append((where, record))
    return out


def _file_record(path: Path, problems: list[TaskProblem]) -> dict[str, Any] | None:
    try:
        text = path.read_text(encoding="utf-8")
        record = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(TaskProblem(str(path), None, f"cannot read: {exc}"))
        return None
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        problems.append(TaskProblem(str(path), None, f"bad {path.suffix[1:].upper()}: {exc}"))
        return None
    if not isinstance(record, dict):
        problems.append(TaskProblem(str(path), None, "must hold one JSON object"))
        return None
    return record


def _tree_files(root: Path, problems: list[TaskProblem], *, binary: bool,
                limits: SetupLimits) -> tuple[dict[str, str], dict[str, str]]:
    text, raw, errors = read_tree(root, binary=binary, limits=limits)
    problems.extend(TaskProblem(str(f), None, why) for f, why in errors)
    return text, raw


def _harbor_task(folder: Path, problems: list[TaskProblem], limits: SetupLimits) -> dict[str, Any] | None:
    record, reasons = harbor_record(folder, limits=limits)
    problems.extend(TaskProblem(str(folder), folder.name, reason) for reason in reasons)
    return record


def _folder_task(folder: Path, problems: list[TaskProblem], limits: SetupLimits) -> dict[str, Any] | None:
    if is_harbor_task(folder):
        return _harbor_task(folder, problems, limits)
    spec_files = [folder / n for n in ("task.json", "task.toml") if (folder / n).is_file()]
    if not spec_files:
        problems.append(TaskProblem(str(folder), None, "task folder has no task.json or task.toml"))
        return None
    try:
        check_inside(spec_files[0], folder)
    except ValueError as exc:
        problems.append(TaskProblem(str(spec_files[0]), None, str(exc)))
        return None
    record = _file_record(spec_files[0], problems)
    if record is None:
        return None
    record.setdefault("id", folder.name)
    if (folder / FILES_DIR).is_dir():  # text or binary, each file where its bytes say; the record's own win
        text, raw = _tree_files(folder / FILES_DIR, problems, binary=True, limits=limits)
        record["files"] = {**text, **(record.get("files") or {})}
        if raw:
            record["binary_files"] = {**raw, **(record.get("binary_files") or {})}
    if (folder / "verifier").is_dir():
        record["verifier_files"] = {**_tree_files(folder / "verifier", problems, binary=False, limits=limits)[0],
                                    **(record.get("verifier_files") or {})}
    return record


def _raw_records(path: Path, problems: list[TaskProblem], limits: SetupLimits) -> list[tuple[str, dict[str, Any]]]:
    if path.is_file():
        if path.suffix == ".jsonl":
            return _jsonl_records(path, problems)
        if path.suffix in (".json", ".toml"):
            record = _file_record(path, problems)
            return [(str(path), record)] if record is not None else []
        problems.append(TaskProblem(str(path), None, "a task file must end in .jsonl, .json or .toml"))
        return []
    if not path.is_dir():
        problems.append(TaskProblem(str(path), None, "no such task file or folder"))
        return []
    if is_harbor_task(path):  # one Harbor task rather than a dataset of them
        record = _harbor_task(path, problems, limits)
        return [(str(path), record)] if record is not None else []
    out: list[tuple[str, dict[str, Any]]] = []
    entries = sorted(path.iterdir())
    harbor_set = any(e.is_dir() and is_harbor_task(e) for e in entries)
    for entry in entries:
        if entry.name.startswith((".", "_")):  # hidden files, __pycache__
            continue
        if harbor_set and entry.name == "registry.json":  # a Harbor dataset's list of its tasks, not a task
            continue
        if entry.is_dir():
            record = _folder_task(entry, problems, limits)
            if record is not None:
                out.append((str(entry), record))
        elif entry.suffix in (".jsonl", ".json", ".toml"):
            out.extend(_raw_records(entry, problems, limits))
    if not out and not problems:
        problems.append(TaskProblem(str(path), None, "folder holds no tasks (.jsonl, .json, .toml or task folders)"))
    return out


def _describe(err: ValidationError) -> list[str]:
    msgs = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "task"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "missing":
            msg = "missing (required)"
        elif e["type"] == "extra_forbidden":
            msg = "unknown field"
        msgs.append(f"{loc}: {msg}" if e["loc"] else msg)
    return msgs


def resolve_path(path: str | Path) -> Path:
    if (harbor := strip_prefix(str(path))) is not None:
        return Path(harbor).expanduser()
    if (named := NAMED_SETS.get(str(path))) is not None:
        return named
    return Path(path).expanduser()


def _check(path: str | Path, limits: SetupLimits) -> tuple[list[TaskSpec], list[TaskProblem]]:
    problems: list[TaskProblem] = []
    specs: list[TaskSpec] = []
    seen: dict[str, str] = {}
    for where, record in _raw_records(resolve_path(path), problems, limits):
        raw_id = record.get("id") if isinstance(record.get("id"), str) else None
        try:
            spec = TaskSpec.model_validate(record)
        except ValidationError as exc:
            msgs = _describe(exc)
            # Pydantic skips the model check when a field fails: say a grader is missing here too.
            if _NO_GRADER not in msgs and not any(record.get(k) for k in ("verifier", "expect_answer", "expect_files", "gui", "harbor", "judge",
                                                        "expect_requests", "osworld", "family")):
                msgs.append(_NO_GRADER)
            problems.extend(TaskProblem(where, raw_id, msg) for msg in msgs)
            continue
        if spec.id in seen:
            problems.append(TaskProblem(where, spec.id, f"duplicate id (first defined at {seen[spec.id]})"))
            continue
        seen[spec.id] = where
        specs.append(spec)
    return specs, sorted(problems, key=_order)


def _order(problem: TaskProblem) -> tuple[str, int]:
    """File order, then line order (reading problems are found before schema problems)."""
    file, _, line = problem.where.rpartition(":")
    return (file, int(line)) if line.isdigit() else (problem.where, 0)


def validate_tasks(path: str | Path, *, limits: SetupLimits = SetupLimits()) -> list[TaskProblem]:
    """Every problem in a task set (empty = valid): bad JSON lines, missing fields, bad ranges, duplicates, a
    link out of a task folder, setup files past `limits` (the config's tasks.max_setup_file_mb / max_setup_files)."""
    return _check(path, limits)[1]


def load_tasks(path: str | Path, *, include: list[str] | None = None,
               limits: SetupLimits = SetupLimits()) -> list[TaskSpec]:
    """Load a task set; raises TaskError naming the problems (see `forge tasks validate`)."""
    specs, problems = _check(path, limits)
    if problems:
        shown = "; ".join(str(p) for p in problems[:3])
        more = f" (and {len(problems) - 3} more; run `forge tasks validate {path}`)" if len(problems) > 3 else ""
        raise TaskError(f"{len(problems)} problem(s) in task set {path}: {shown}{more}")
    if include:
        unknown = sorted(set(include) - {s.id for s in specs})
        if unknown:
            raise TaskError(f"task set {path} has no task(s) {', '.join(unknown)}")
        specs = [s for s in specs if s.id in set(include)]
    return specs


# ---------------------------------------------------------------------------------------------
# Scores


def parse_score(exit_code: int, stdout: str) -> tuple[float, str | None]:
    """A verifier's reward and, when its output was unusable, why.

    A verifier that exits non-zero gives 0.0 whatever it printed: a score line can come from the
    agent's own code run by the verifier, an exit code cannot. On exit 0, the last non-empty stdout
    line `score: X` or `X` (a number) wins; X outside [0, 1] or NaN is an error (reward 0.0); without
    a score line the reward is 1.0.
    """
    if exit_code != 0:
        return 0.0, None
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    if lines:
        last = lines[-1]
        m = re.fullmatch(r"(?i:score\s*[:=]\s*)?([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)", last)
        if m:
            value = float(m.group(1))
            if math.isnan(value) or not 0.0 <= value <= 1.0:
                return 0.0, f"verifier printed score {m.group(1)} outside [0, 1]"
            return value, None
        if re.match(r"(?i)score\s*[:=]", last):
            return 0.0, f"verifier printed an unreadable score line {last[:80]!r}"
    return 1.0, None
