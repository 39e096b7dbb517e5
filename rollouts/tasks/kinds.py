"""Task families as plugins: what a family of tasks contributes to a rollout, behind one protocol.

    kind = kind_of(task)                  # the one place a task's family is decided
    site = kind.open_site(task)           # its display: a site, a live page, a desktop (or None)
    config = kind.sandbox_config(task, backend, sandbox_config)   # its image, services, limits
    await kind.prepare(sb, task, site)    # after setup, before the agent: its own probes
    if not await kind.drive(runner, sb, ro, task, harness, ctx, env): ...   # one harness run, or its steps
    reward, said, note = await kind.grade(grader, sb, ro, task, answer, site, services=services)
    kind.attacks(task)                    # `forge tasks validate --run`: its own hostile agents, each must score 0

The runner, the grader, the eval summary, the dry-run plan and `forge tasks import` ask only these members;
no module outside a family's own names its fields. A family is a class of `TaskKindBase` (each member has the
plain task's behaviour until the family overrides it), found by name in, first match wins:

    KINDS                          the families forge ships, in the order they claim a task (registry.py)
    entry points `openforge.task_kinds`  installed packages: `name = "package.module:KindClass"`
    PlainKind                      every task no family claims: exact graders, a verifier, a judge

A task with a `family` payload belongs to the kind its `kind` names (the kind's `payload_model` is the model
the loader validated it with: a family from another package brings its own). Any other task belongs to the
first kind whose `claims(task)` is true, else to the plain kind. An OSWorld-format task is also a desktop task:
its kind extends the desktop kind. A family that only brings an importer (`forge tasks import NAME SRC`:
`import_tasks`) has no payload and claims no loaded task: its tasks are plain.

The runner and its grader are handed to a kind as the protocols below (`RolloutDriving`, `RolloutGrading`),
so this module imports nothing of rollouts/runner/, which imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from openforge.errors import TaskError
from openforge.rollouts.tasks.importing import ImportOption, ImportResult
from openforge.rollouts.tasks.payload import FamilyPayload
from openforge.rollouts.tasks.registry import family_names, kind_class

if TYPE_CHECKING:
    from openforge.config import ForgeConfig
    from openforge.rollouts.harnesses.base import Harness, HarnessContext
    from openforge.rollouts.tasks.format import TaskSpec
    from openforge.sandbox.base import Sandbox
    from openforge.store import Rollout, Store

Graded = tuple[float, str, "str | None"]  # (reward, what the graders said, a note when a verifier's output was unusable)


class RolloutGrading(Protocol):
    """What a family's graders may ask of forge's grader (rollouts/runner/grader.py `RolloutGrader` is it): the
    run's settings and store, the whole grade, the exact graders, the judge weighed beside a kind's own, the
    grader's folders made safe, a file the task expects, the judge route of a rollout."""

    config: ForgeConfig
    store: Store

    async def grade(self, sb: Sandbox, ro: Rollout, task: TaskSpec, answer: str, site: Any = None, *,
                    services: Any = None) -> Graded: ...

    async def grade_with_judge(self, kind: TaskKind, sb: Sandbox, ro: Rollout, task: TaskSpec, answer: str,
                               site: Any = None, *, services: Any = None) -> Graded: ...

    async def grade_checks(self, sb: Sandbox, task: TaskSpec, answer: str, *, services: Any = None,
                           ro: Rollout | None = None, site_check: Callable[[], tuple[bool, str]] | None = None,
                           ) -> Graded: ...

    async def grader_folders(self, sb: Sandbox, task: TaskSpec) -> None: ...

    async def read_expected(self, sb: Sandbox, path: str, limit: int) -> bytes | None: ...

    async def policy_base(self, ro: Rollout) -> Any: ...


class RolloutDriving(Protocol):
    """What a kind that drives its rollout itself (`drive`) is handed (rollouts/runner/runner.py `RolloutRunner`
    is it): the run's settings and store, its grader, and what the step driver it may hand the runner on to
    needs (rollouts/runner/steps.py takes harness_run.py's `RolloutDriver`: the trajectory assembled, the
    ending recorded)."""

    config: ForgeConfig
    store: Store
    grader: RolloutGrading

    async def _assemble(self, rollout_id: str, harness: Harness) -> str | None: ...

    async def _finish(self, rollout_id: str, *, status: str, only_unfinished: bool = False, **fields: Any) -> None: ...


@runtime_checkable
class TaskKind(Protocol):
    """A family of tasks: how its tasks get their resources, are driven and graded, and are described."""

    name: str
    payload_model: type[FamilyPayload] | None  # the model of its part of a task (`family`), None for none
    import_formats: tuple[str, ...]  # the FORMAT names of `forge tasks import` it reads (() = no importer)
    import_help: str  # what those formats are, in the FORMAT argument's help: "a claw-eval checkout"
    import_source: str  # what SRC is for them, in the SRC argument's help ("" = not said)
    import_out: str  # what --out is for them when not a folder of task folders: "a .jsonl file"
    import_options: tuple[ImportOption, ...]  # the options only its importer reads (--base, --cache, ...)

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

    async def drive(self, runner: RolloutDriving, sb: Sandbox, ro: Rollout, task: TaskSpec, harness: Harness,
                    ctx: HarnessContext, env: dict[str, str]) -> bool:
        """Run the whole rollout itself (steps) and record its ending: True; False: the runner's one harness run."""
        ...

    async def grade(self, grader: RolloutGrading, sb: Sandbox, ro: Rollout, task: TaskSpec, answer: str,
                    site: Any = None, *, services: Any = None) -> Graded:
        """The rollout's reward once the agent is gone: the exact graders and a judge, or the family's own."""
        ...

    async def grade_exact(self, grader: RolloutGrading, sb: Sandbox, ro: Rollout | None, task: TaskSpec, answer: str,
                          site: Any = None, *, services: Any = None) -> Graded:
        """The exact graders alone (a judge component is weighed beside them by `grade`)."""
        ...

    def run_figures(self, store: Store, run_id: str) -> dict[str, Any]:
        """The family's own figures of an eval run, by key, beside forge's in its summary ({} for none)."""
        ...

    def summary_lines(self, summary: dict[str, Any]) -> list[str]:
        """`forge eval`'s lines of the family's own figures, read from the run's summary (what `run_figures`
        put there); [] for none."""
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

    def import_tasks(self, src: str, out: str, *, fmt: str, options: dict[str, Any]) -> ImportResult:
        """`forge tasks import FMT SRC --out OUT [options]`: convert a source of format `fmt` (one of its
        `import_formats`) into forge tasks written to `out` (its own default when ""), nothing written when
        none converts; `options`: each of its `import_options` by name, given or its default."""
        ...


class TaskKindBase:
    """The plain task's behaviour for every member: a family overrides what it brings."""

    name: ClassVar[str] = "plain"
    payload_model: ClassVar[type[FamilyPayload] | None] = None
    import_formats: ClassVar[tuple[str, ...]] = ()
    import_help: ClassVar[str] = ""
    import_source: ClassVar[str] = ""
    import_out: ClassVar[str] = ""
    import_options: ClassVar[tuple[ImportOption, ...]] = ()

    def claims(self, task: TaskSpec) -> bool:
        """A task whose payload is this family's (kind_of asks only for a task without one)."""
        return self.payload_model is not None and isinstance(task.family, self.payload_model)

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

    async def drive(self, runner: RolloutDriving, sb: Sandbox, ro: Rollout, task: TaskSpec, harness: Harness,
                    ctx: HarnessContext, env: dict[str, str]) -> bool:
        return False

    async def grade(self, grader: RolloutGrading, sb: Sandbox, ro: Rollout, task: TaskSpec, answer: str,
                    site: Any = None, *, services: Any = None) -> Graded:
        return await grader.grade_with_judge(self, sb, ro, task, answer, site, services=services)

    async def grade_exact(self, grader: RolloutGrading, sb: Sandbox, ro: Rollout | None, task: TaskSpec, answer: str,
                          site: Any = None, *, services: Any = None) -> Graded:
        return await grader.grade_checks(sb, task, answer, services=services, ro=ro)

    def run_figures(self, store: Store, run_id: str) -> dict[str, Any]:
        return {}

    def summary_lines(self, summary: dict[str, Any]) -> list[str]:
        return []

    def attacks(self, task: TaskSpec) -> dict[str, str]:
        return {}

    def idle_run_credited(self, task: TaskSpec) -> bool:
        return False

    def solution_files(self, task: TaskSpec, step: str) -> dict[str, str]:
        return task.solution_files

    def solution_workdir(self, task: TaskSpec) -> str:
        return ""

    def import_tasks(self, src: str, out: str, *, fmt: str, options: dict[str, Any]) -> ImportResult:
        raise TaskError(f"task family {self.name!r} has no importer")


class PlainKind(TaskKindBase):
    """A task no family claims: the exact graders (answer, files, services' record, verifier) and a judge."""

    def claims(self, task: TaskSpec) -> bool:
        return True


PLAIN = PlainKind()
_loaded: dict[str, TaskKindBase] = {}


def kind_names() -> list[str]:
    """Every family's name, in the order they claim a task (the plain kind last)."""
    return [*family_names(), PLAIN.name]


def get_kind(name: str) -> TaskKindBase:
    """The family `name`, built once. TaskError if unknown or its module cannot load."""
    if name == PLAIN.name:
        return PLAIN
    if name not in _loaded:
        cls = kind_class(name)
        kind = cls()
        if not isinstance(kind, TaskKind):
            raise TaskError(f"task family {name!r}: {cls!r} is not a TaskKind")
        _loaded[name] = kind
    return _loaded[name]


@cache
def _claim_order() -> tuple[str, ...]:
    return tuple(kind_names()[:-1])  # entry points read once: kind_of runs for every rollout


def kind_of(task: TaskSpec) -> TaskKindBase:
    """The family of `task`: the one its payload's `kind` names; for a task without one, the first that claims
    it (KINDS, then installed ones), else the plain kind."""
    if task.family is not None:
        return get_kind(task.family.kind)  # loaded already: the loader validated the payload with its model
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


def import_formats() -> dict[str, TaskKindBase]:
    """`forge tasks import`'s formats: name -> the family whose importer reads it, in the families' order. A
    family that cannot be loaded is left out here (asked for by name, it says why: `importer_of`)."""
    formats: dict[str, TaskKindBase] = {}
    for name in family_names():
        try:
            kind = get_kind(name)
        except TaskError:
            continue
        formats.update({fmt: kind for fmt in kind.import_formats if fmt not in formats})
    return formats


def importer_of(fmt: str) -> TaskKindBase:
    """The family whose importer reads format `fmt`. TaskError naming the formats there are when none does."""
    formats = import_formats()
    if fmt in formats:
        return formats[fmt]
    if fmt in family_names():
        get_kind(fmt)  # an installed family that cannot be loaded says why
    raise TaskError(f"unknown import format {fmt!r}: {', '.join(formats)}")
