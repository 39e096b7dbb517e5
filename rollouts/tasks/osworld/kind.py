"""The OSWorld-format family as a task kind (rollouts/tasks/kinds.py): a desktop task (its display and
applications: desktop/kind.py) whose evaluator is its grader: its getters run in the sandbox after the agent
is gone, OSWorld's metric on the host (rollouts/tasks/osworld/evaluator.py)."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

from openforge.rollouts.tasks.desktop.kind import DesktopKind
from openforge.rollouts.tasks.desktop.task import DesktopTask
from openforge.rollouts.tasks.importing import ImportOption, ImportResult
from openforge.rollouts.tasks.kinds import Graded, RolloutGrading
from openforge.rollouts.tasks.osworld.payload import OSWorldPayload

if TYPE_CHECKING:
    from openforge.rollouts.tasks.format import TaskSpec
    from openforge.sandbox.base import Sandbox
    from openforge.store import Rollout


def planted_files(task: TaskSpec) -> str:
    """The planted-files agent's script for an OSWorld-format task: junk where its getters read a result
    file and at the names of its expected files, the task left undone."""
    osworld = task.payload(OSWorldPayload)
    assert osworld is not None
    paths = [p for g in [*osworld.evaluator.result, *osworld.evaluator.expected] if g is not None and g.type != "rule"
             for p in g.paths]
    return "".join(f"mkdir -p \"$(dirname {shlex.quote(p)})\" && printf 'PK planted' > {shlex.quote(p)}\n" for p in paths)


class OSWorldKind(DesktopKind):
    name = "osworld"
    payload_model = OSWorldPayload
    import_formats = ("osworld",)
    import_help = "OSWorld-format JSON tasks"
    import_options = (ImportOption("cache", "an OSWorld cache folder holding local copies of the tasks' downloads "
                                            "(CACHE/<task id>/...)"),)

    def import_tasks(self, src: str, out: str, *, fmt: str, options: dict[str, Any]) -> ImportResult:
        """OSWorld-format JSON tasks (rollouts/tasks/osworld/importer.py) as task folders (default osworld-tasks/):
        online-only and unsupported ones refused; imported ones this machine cannot run noted apart."""
        from openforge.rollouts.tasks.importing import write_tasks
        from openforge.rollouts.tasks.osworld.importer import import_osworld

        report = import_osworld(src, cache=options["cache"])
        refused = [(task_id, f"{why_kind}: {why}") for why_kind, found in
                   (("online-only", report.online_only), ("unsupported", report.unsupported)) for task_id, why in found]
        notes = [(task_id, f"{why_kind}: {why}") for why_kind, found in
                 (("imported, not runnable here", report.not_here), ("imported, note", report.notes))
                 for task_id, why in found]
        if not report.tasks:
            return ImportResult(tasks=[], written_to="", refused=refused, notes=notes)
        folder = write_tasks(report.tasks, out or "osworld-tasks")
        total = len(report.tasks) + len(report.online_only) + len(report.unsupported)
        return ImportResult(
            tasks=report.tasks, written_to=str(folder), refused=refused, notes=notes,
            summary=f"{src}: {total} OSWorld-format task(s): {len(report.tasks)} imported to {folder} "
                    f"({len(report.tasks) - len(report.not_here)} with what they need installed here, "
                    f"{len(report.not_here)} need a desktop application not installed here, root or a D-Bus session; "
                    "`forge tasks validate --run` shows which a reference passes), "
                    f"{len(report.online_only)} online-only, {len(report.unsupported)} unsupported")

    def desktop(self, task: TaskSpec) -> DesktopTask | None:
        osworld = task.payload(OSWorldPayload)
        return osworld.desktop if osworld is not None else None

    def attacks(self, task: TaskSpec) -> dict[str, str]:
        """Junk planted where its getters read, with or without a solution: a grader that credits it is a bug
        either way (an infeasible task's evaluator reads no file)."""
        osworld = task.payload(OSWorldPayload)
        return {} if osworld is None or osworld.evaluator.infeasible else {"planted files": planted_files(task)}

    async def grade_exact(self, grader: RolloutGrading, sb: Sandbox, ro: Rollout | None, task: TaskSpec, answer: str,
                          site: Any = None, *, services: Any = None) -> Graded:
        """The task's evaluator. A metric that cannot run is the infrastructure's failure."""
        from openforge.rollouts.runner.grader import InfraFailure, run_in_sandbox, tail, verifier_env
        from openforge.rollouts.tasks.osworld.evaluator import OSWorldUnavailable, grade_osworld
        from openforge.sandbox.base import SandboxPathRefused

        osworld = task.payload(OSWorldPayload)
        assert osworld is not None
        try:
            await grader.grader_folders(sb, task)
        except SandboxPathRefused as exc:  # the agent planted a link or FIFO where the grader writes
            return 0.0, f"the grader's files cannot be written: {exc}", None
        limit, env = grader.config.runner.verifier_timeout_s, verifier_env(sb.info.workdir)
        try:
            reward, output = await grade_osworld(
                osworld.evaluator, answer, read_file=lambda path, cap: grader.read_expected(sb, path, cap),
                run=lambda line: run_in_sandbox(grader.config, sb, line, timeout=limit, env=env))
        except OSWorldUnavailable as exc:
            raise InfraFailure(f"the task's OSWorld evaluator could not run: {exc}") from None
        return reward, tail(output), None
