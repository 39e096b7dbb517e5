"""The Harbor / Terminal-Bench family as a task kind (rollouts/tasks/kinds.py): its tests, copied in after the
agent is gone and run, are its grader (rollouts/tasks/harbor/verifier.py); a multi-step task's [[steps]] run
as one harness run per step in the one sandbox, each graded before the next (rollouts/runner/steps.py). Its
image, docker-compose services and limits are the sandbox config's (`TaskKindBase.sandbox_config`). Under
`forge tasks validate --run` a task with a reference also meets FORGED_REWARD and PLANTED_PYTEST
(rollouts/tasks/selfcheck.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from openforge.rollouts.tasks.harbor.payload import HarborPayload
from openforge.rollouts.tasks.importing import ImportOption, ImportResult
from openforge.rollouts.tasks.kinds import Graded, RolloutDriving, RolloutGrading, TaskKindBase

if TYPE_CHECKING:
    from openforge.rollouts.harnesses.base import Harness, HarnessContext
    from openforge.rollouts.tasks.format import TaskSpec
    from openforge.sandbox.base import Sandbox
    from openforge.store import Rollout


# An agent that fakes a Harbor reward instead of doing the task: reward files at Harbor's path, at the
# paths a local sandbox might map it to, and a writer left running to fill any folder named later.
FORGED_REWARD = """
for d in /logs/verifier logs/verifier .harbor/logs/verifier .harbor-0/logs/verifier /forge-grader/logs/verifier; do
  mkdir -p "$d" 2>/dev/null && echo 1 > "$d/reward.txt" && echo '{"reward": 1}' > "$d/reward.json"
done 2>/dev/null
nohup sh -c 'while :; do for d in .harbor-*/logs/verifier /logs/verifier /forge-grader/*/logs/verifier; do
  echo 1 > "$d/reward.txt"; echo "{\\"reward\\": 1}" > "$d/reward.json"; done 2>/dev/null; sleep 0.01; done' \
  >/dev/null 2>&1 &
true
"""


# An agent that leaves the tests' runner its own files instead of doing the task: a conftest.py that exits 0
# before any test runs, a pytest.py that says all passed (`python -m pytest` from its folder), a pytest.ini
# that only collects, in every folder it can write (the working folder, $HOME, the temp folders, Harbor's
# /tests and /logs, the folders above them and forge's grader folders, wherever they can be made).
PLANTED_PYTEST = r"""
plant() {
  mkdir -p "$1" && printf 'import os\nos._exit(0)\n' > "$1/conftest.py" &&
    printf 'import sys\nprint("1 passed")\nsys.exit(0)\n' > "$1/pytest.py" &&
    printf '[pytest]\naddopts = --collect-only -q\n' > "$1/pytest.ini"
} 2>/dev/null
{ find / -maxdepth 3 \( -path /proc -o -path /sys -o -path /dev \) -prune -o -type d -writable -print 2>/dev/null
  for d in "$PWD" "$PWD/tests" "$PWD/.harbor" "$PWD/.harbor-0" "$PWD/.." "$HOME" "${TMPDIR:-/tmp}" /tmp /tests \
    /logs /logs/verifier /app / /sandbox /sandbox/grader /forge-grader; do echo "$d"; done
} | head -n 300 | while read -r d; do plant "$d"; done
true
"""


class HarborKind(TaskKindBase):
    name = "harbor"
    payload_model = HarborPayload
    import_formats = ("harbor",)
    import_help = "task folders, their Dockerfiles built into images"
    import_source = "a Harbor dataset folder or task"
    import_options = (ImportOption("base", "FROM=IMAGE, build a task whose Dockerfile says FROM FROM on the local "
                                           "IMAGE instead (builds are offline; repeatable)", repeatable=True),)

    def import_tasks(self, src: str, out: str, *, fmt: str, options: dict[str, Any]) -> ImportResult:
        """Each task's Dockerfile built into its image (rollouts/tasks/harbor/image.py), the tasks written as task
        folders (default harbor-tasks/), and a notice of the tasks whose storage size a backend cannot hold."""
        from openforge.rollouts.tasks.harbor.image import import_harbor, parse_base_map
        from openforge.rollouts.tasks.importing import write_tasks
        from openforge.sandbox.limits import storage_notice

        report = import_harbor(src, bases=parse_base_map(options["base"] or []))
        notes = [(task_id, f"imported, note: {why}") for task_id, why in report.notes]
        if not report.tasks:
            return ImportResult(tasks=[], written_to="", refused=report.refused, notes=notes)
        folder = write_tasks(report.tasks, out or "harbor-tasks")
        notice = storage_notice([t["id"] for t in report.tasks if (t.get("limits") or {}).get("storage_mb")], None)
        line = (f"{src}: {len(report.tasks) + len(report.refused)} task(s): {len(report.tasks)} imported to "
                f"{folder} ({len(report.built)} image(s) built, {len(report.cached)} cached), "
                f"{len(report.refused)} refused")
        return ImportResult(tasks=report.tasks, written_to=str(folder), refused=report.refused, notes=notes,
                            summary=f"{notice}\n{line}" if notice else line)

    def describe(self, task: TaskSpec) -> str:
        return "harbor"

    async def drive(self, runner: RolloutDriving, sb: Sandbox, ro: Rollout, task: TaskSpec, harness: Harness,
                    ctx: HarnessContext, env: dict[str, str]) -> bool:
        """A multi-step task: a harness run per step, each graded by the step's own tests."""
        harbor = task.payload(HarborPayload)
        if harbor is None or harbor.steps is None:
            return False
        steps = harbor.steps
        from openforge.rollouts.runner.steps import drive_steps

        async def grade_step(step: Any, answer: str) -> Graded:
            at_step = harbor.model_copy(update={"tests": step.tests})  # graded by this step's tests
            return await runner.grader.grade(sb, ro, task.model_copy(update={"family": at_step}), answer)

        await drive_steps(runner, sb, ro, harness, ctx, env, steps=steps.steps, grade_step=grade_step,
                          combine=steps.combined, rule=steps.reward)
        return True

    def attacks(self, task: TaskSpec) -> dict[str, str]:
        """A task with a reference solution also meets a forged reward file and planted pytest files."""
        return {"forged reward": FORGED_REWARD, "planted pytest": PLANTED_PYTEST} if task.solution else {}

    def solution_files(self, task: TaskSpec, step: str) -> dict[str, str]:
        """At a step of a multi-step task, that step's steps/<name>/solution/, as Harbor's oracle uploads it to
        /solution at each step (rollouts/tasks/harbor/steps.py)."""
        harbor = task.payload(HarborPayload)
        if harbor is not None and harbor.steps is not None and step:
            return next(s.solution_files for s in harbor.steps.steps if s.name == step)
        return task.solution_files

    def solution_workdir(self, task: TaskSpec) -> str:
        harbor = task.payload(HarborPayload)
        return harbor.tests.workdir if harbor is not None and harbor.tests is not None else ""

    async def grade_exact(self, grader: RolloutGrading, sb: Sandbox, ro: Rollout | None, task: TaskSpec, answer: str,
                          site: Any = None, *, services: Any = None) -> Graded:
        """The task's tests, copied in now (the agent is gone) and run; the reward file read on the host. A
        verifier that could not run is the infrastructure's."""
        from openforge.rollouts.runner.grader import InfraFailure, run_in_sandbox, tail, verifier_env
        from openforge.rollouts.tasks.harbor.verifier import VerifierUnavailable, run_harbor_tests
        from openforge.sandbox.base import SandboxPathRefused

        harbor = task.payload(HarborPayload)
        assert harbor is not None and harbor.tests is not None
        try:
            await grader.grader_folders(sb, task)
        except SandboxPathRefused as exc:  # the agent planted a link or FIFO where the grader writes
            return 0.0, f"the grader's files cannot be written: {exc}", None
        try:
            reward, output, note = await run_harbor_tests(
                sb, harbor.tests, lambda cmd, timeout, env: run_in_sandbox(grader.config, sb, cmd, timeout=timeout,
                                                                          env=env),
                verifier_env(sb.info.workdir))
        except VerifierUnavailable as exc:
            raise InfraFailure(f"the task's verifier could not run: {exc}") from None
        return reward, tail(output), note
