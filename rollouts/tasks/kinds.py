"""Task families as plugins: what a family of tasks contributes to a rollout, behind one protocol.

    kind = kind_of(task)                  # the one place a task's family is decided
    site = kind.open_site(task)           # its display: a site, a live page, a desktop (or None)
    config = kind.sandbox_config(task, backend, sandbox_config)   # its image, services, limits
    await kind.prepare(sb, task, site)    # after setup, before the agent: its own probes
    if not await kind.drive(runner, sb, ro, task, harness, ctx, env): ...   # one harness run, or its steps
    reward, said, note = await kind.grade(grader, sb, ro, task, answer, site, services=services)
    kind.attacks(task)                    # `forge tasks validate --run`: its own hostile agents, each must score 0

The runner, the grader, the eval summary and the dry-run plan ask only these members; no module outside a
family's own names its fields. A family is a class of `TaskKindBase` (each member has the plain task's
behaviour until the family overrides it), found by name in, first match wins:

    KINDS                          the families forge ships, in the order they claim a task
    entry points `openforge.task_kinds`  installed packages: `name = "package.module:KindClass"`
    PlainKind                      every task no family claims: exact graders, a verifier, a judge

A task belongs to the first kind whose `claims(task)` is true. The families shipped are mutually exclusive
by their fields (a Harbor task has `harbor`, an OSWorld one `osworld` and a desktop, ...), except that an
OSWorld-format task is also a desktop task: its kind extends the desktop kind. A family that only brings
an importer (`forge tasks import NAME SRC`: `import_tasks`) claims no loaded task: its tasks are plain.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from openforge.errors import TaskError
from openforge.lazy import lazy_class

if TYPE_CHECKING:
    from openforge.config import ForgeConfig
    from openforge.rollouts.harnesses.base import Harness, HarnessContext
    from openforge.rollouts.runner.grader import RolloutGrader
    from openforge.rollouts.runner.runner import RolloutRunner
    from openforge.rollouts.tasks.format import TaskSpec
    from openforge.sandbox.base import Sandbox
    from openforge.store import Rollout, Store

ENTRY_POINT_GROUP = "openforge.task_kinds"
Graded = tuple[float, str, "str | None"]  # (reward, what the graders said, a note when a verifier's output was unusable)

# name -> (module, class): the families forge ships, in the order they claim a task. One line per family.
KINDS: dict[str, tuple[str, str]] = {
    "harbor": ("openforge.rollouts.tasks.harbor.kind", "HarborKind"),
    "osworld": ("openforge.rollouts.tasks.osworld.kind", "OSWorldKind"),
    "claweval": ("openforge.rollouts.tasks.claweval.kind", "ClawEvalKind"),
    "desktop": ("openforge.rollouts.tasks.desktop.kind", "DesktopKind"),
    "web": ("openforge.rollouts.tasks.web.kind", "WebKind"),
    "gsm8k": ("openforge.rollouts.tasks.gsm8k.kind", "Gsm8kKind"),
}


@dataclass
class ImportResult:
    """What `forge tasks import NAME` did: the tasks written where, each refused one with its reason, and a
    line saying it (the CLI prints the refusals, then the line; nothing imported is exit 1)."""

    tasks: list[dict[str, Any]]
    written_to: str
    refused: list[tuple[str, str]] = field(default_factory=list)
    summary: str = ""


@runtime_checkable
class TaskKind(Protocol):
    """A family of tasks: how its tasks get their resources, are driven and graded, and are described."""

    name: str
    import_help: str  # what `forge tasks import NAME` reads ("" = no importer)

    def claims(self, task: TaskSpec) -> bool:
        """Whether `task` is of this family."""
        ...

    def describe(self, task: TaskSpec) -> str:
        """How the task is run and graded, in a word (the dry-run plan's counts: "harbor", "gui", "exact")."""
        ...

    def check_run(self, tasks: list[TaskSpec], config: ForgeConfig) -> None:
        """ConfigError (one line) when the run cannot take these tasks of this family at all."""
        ...

    def open_site(self, task: TaskSpec) -> Any:
        """The display resource of one rollout, opened on the host before its sandbox (a site session, a live
        page, a desktop: each has `socket_path`, `gui_spec()`, `close()`), or None. InfraFailure if it cannot."""
        ...

    def sandbox_config(self, task: TaskSpec, backend: Any, config: Any) -> Any:
        """The sandbox config the task's rollouts start with: the run's, with the task's image, services
        beside it and limits applied by the backend class (sandbox/base.py `with_image`, ...)."""
        ...

    def needs_own_sandbox_config(self, task: TaskSpec) -> bool:
        """Whether `sandbox_config` changes anything for `task` (else its rollouts share the run's config)."""
        ...

    async def prepare(self, sb: Sandbox, task: TaskSpec, site: Any) -> None:
        """After the task's setup, before the agent: the family's probes. InfraFailure when it cannot start."""
        ...

    async def drive(self, runner: RolloutRunner, sb: Sandbox, ro: Rollout, task: TaskSpec, harness: Harness,
                    ctx: HarnessContext, env: dict[str, str]) -> bool:
        """Run the whole rollout itself (steps) and record its ending: True; False: the runner's one harness run."""
        ...

    async def grade(self, grader: RolloutGrader, sb: Sandbox, ro: Rollout, task: TaskSpec, answer: str,
                    site: Any = None, *, services: Any = None) -> Graded:
        """The rollout's reward once the agent is gone: the exact graders and a judge, or the family's own."""
        ...

    async def grade_exact(self, grader: RolloutGrader, sb: Sandbox, ro: Rollout | None, task: TaskSpec, answer: str,
                          site: Any = None, *, services: Any = None) -> Graded:
        """The exact graders alone (a judge component is weighed beside them by `grade`)."""
        ...

    def run_figures(self, store: Store, run_id: str) -> dict[str, Any]:
        """The family's own figures of an eval run, by key, beside forge's in its summary ({} for none)."""
        ...

    def attacks(self, task: TaskSpec) -> dict[str, str]:
        """`forge tasks validate --run`: the family's own hostile agents for `task`, label -> a shell script
        run as the agent, each of which must score 0 (a Harbor task's forged reward file, say)."""
        ...

    def idle_run_credited(self, task: TaskSpec) -> bool:
        """Whether the task's reward is a benchmark's formula that credits a clean idle run (ClawEval's task
        score): there an idle agent must not pass and no hostile answer may score above it."""
        ...

    def solution_files(self, task: TaskSpec, step: str) -> dict[str, str]:
        """The reference run's solution/ folder at `step` ("" for a task of one step)."""
        ...

    def solution_workdir(self, task: TaskSpec) -> str:
        """The working folder the task's solution and tests name ("" = the sandbox's own)."""
        ...

    def import_tasks(self, src: str, out: str) -> ImportResult:
        """`forge tasks import NAME SRC --out OUT`: convert a source of this format into forge tasks."""
        ...


class TaskKindBase:
    """The plain task's behaviour for every member: a family overrides what it brings."""

    name: ClassVar[str] = "plain"
    import_help: ClassVar[str] = ""

    def claims(self, task: TaskSpec) -> bool:
        return False

    def describe(self, task: TaskSpec) -> str:
        return "judge" if task.judge is not None else "exact"

    def check_run(self, tasks: list[TaskSpec], config: ForgeConfig) -> None:
        return None

    def open_site(self, task: TaskSpec) -> Any:
        return None

    def sandbox_config(self, task: TaskSpec, backend: Any, config: Any) -> Any:
        # An image and services of a task's own are core fields (a Harbor importer writes them, a task file may).
        if task.image is not None:
            config = backend.with_image(config, task.image.tag, task.image.workdir)
        if task.compose:
            config = backend.with_services(config, [s.model_dump() for s in task.compose])
        return config if task.limits is None else backend.with_limits(config, task.limits)

    def needs_own_sandbox_config(self, task: TaskSpec) -> bool:
        """Whether `sandbox_config` changes anything (the run's config object is shared otherwise)."""
        return task.image is not None or task.limits is not None or bool(task.compose)

    async def prepare(self, sb: Sandbox, task: TaskSpec, site: Any) -> None:
        return None

    async def drive(self, runner: RolloutRunner, sb: Sandbox, ro: Rollout, task: TaskSpec, harness: Harness,
                    ctx: HarnessContext, env: dict[str, str]) -> bool:
        return False

    async def grade(self, grader: RolloutGrader, sb: Sandbox, ro: Rollout, task: TaskSpec, answer: str,
                    site: Any = None, *, services: Any = None) -> Graded:
        return await grader.grade_with_judge(self, sb, ro, task, answer, site, services=services)

    async def grade_exact(self, grader: RolloutGrader, sb: Sandbox, ro: Rollout | None, task: TaskSpec, answer: str,
                          site: Any = None, *, services: Any = None) -> Graded:
        return await grader.grade_checks(sb, task, answer, services=services, ro=ro)

    def run_figures(self, store: Store, run_id: str) -> dict[str, Any]:
        return {}

    def attacks(self, task: TaskSpec) -> dict[str, str]:
        return {}

    def idle_run_credited(self, task: TaskSpec) -> bool:
        return False

    def solution_files(self, task: TaskSpec, step: str) -> dict[str, str]:
        return task.solution_files

    def solution_workdir(self, task: TaskSpec) -> str:
        return ""

    def import_tasks(self, src: str, out: str) -> ImportResult:
        raise TaskError(f"task family {self.name!r} has no importer")


class PlainKind(TaskKindBase):
    """A task no family claims: the exact graders (answer, files, services' record, verifier) and a judge."""

    def claims(self, task: TaskSpec) -> bool:
        return True


PLAIN = PlainKind()
_loaded: dict[str, TaskKindBase] = {}


def kind_names() -> list[str]:
    """Every family's name, in the order they claim a task (the plain kind last)."""
    return list(dict.fromkeys([*KINDS, *(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)), PLAIN.name]))


def get_kind(name: str) -> TaskKindBase:
    """The family `name`, built once. TaskError if unknown or its module cannot load."""
    if name == PLAIN.name:
        return PLAIN
    if name not in _loaded:
        try:
            if name in KINDS:
                cls = lazy_class(*KINDS[name])
            else:
                found = entry_points(group=ENTRY_POINT_GROUP, name=name)
                if not found:
                    raise TaskError(f"unknown task family {name!r}; known: {', '.join(kind_names())}")
                cls = next(iter(found)).load()
        except (ImportError, LookupError) as exc:
            raise TaskError(f"task family {name!r} cannot be loaded: {exc}") from None
        kind = cls()
        if not isinstance(kind, TaskKind):
            raise TaskError(f"task family {name!r}: {cls!r} is not a TaskKind")
        _loaded[name] = kind
    return _loaded[name]


@cache
def _claim_order() -> tuple[str, ...]:
    return tuple(kind_names()[:-1])  # entry points read once: kind_of runs for every rollout


def kind_of(task: TaskSpec) -> TaskKindBase:
    """The family of `task`: the first that claims it (KINDS, then installed ones), else the plain kind."""
    for name in _claim_order():
        kind = get_kind(name)
        if kind.claims(task):
            return kind
    return PLAIN


def kinds_of(tasks: Iterable[TaskSpec]) -> dict[str, tuple[TaskKindBase, list[TaskSpec]]]:
    """The tasks grouped by family: name -> (kind, its tasks), in the tasks' order."""
    groups: dict[str, tuple[TaskKindBase, list[TaskSpec]]] = {}
    for task in tasks:
        kind = kind_of(task)
        groups.setdefault(kind.name, (kind, []))[1].append(task)
    return groups


def check_run(tasks: Iterable[TaskSpec], config: ForgeConfig) -> None:
    """ConfigError (one line) when a family refuses its tasks in this run (online-only tasks, say): each
    family judges its own group, before any engine or sandbox starts."""
    for kind, group in kinds_of(tasks).values():
        kind.check_run(group, config)
