"""The ClawEval family as a task kind (rollouts/tasks/kinds.py): an imported task's own grader.py, run on the
host after the agent is gone on the trace forge recorded (rollouts/tasks/claweval/score.py). Its task score
is the reward; under `claweval.reward = "judge"` forge's graders and judge give the reward and ClawEval's
scores are said and stored beside it. An eval's summary gains ClawEval's own figures."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from openforge.rollouts.tasks.claweval.payload import ClawEvalPayload
from openforge.rollouts.tasks.importing import ImportOption, ImportResult
from openforge.rollouts.tasks.kinds import Graded, RolloutGrading, TaskKindBase

if TYPE_CHECKING:
    from openforge.rollouts.tasks.format import TaskSpec
    from openforge.sandbox.base import Sandbox
    from openforge.store import Rollout, Store

SNAPSHOT_MAX_BYTES = 16 << 20  # a file copied out for a ClawEval grader (env_snapshot); past it, an error entry


class ClawEvalKind(TaskKindBase):
    name = "claweval"
    payload_model = ClawEvalPayload
    import_formats = ("claweval",)
    import_help = "a claw-eval checkout"
    import_source = "a claw-eval checkout (or its tasks/ folder)"
    import_options = (ImportOption("reward", "the tasks' reward: claweval (ClawEval's task score from its grader.py, "
                                             "its judge inside) or judge (forge's judge on the rubric beside the exact "
                                             "tool_called rules; ClawEval's score reported beside it)",
                                   default="claweval"),)

    def import_tasks(self, src: str, out: str, *, fmt: str, options: dict[str, Any]) -> ImportResult:
        """A claw-eval checkout's tasks (rollouts/tasks/claweval/importer.py) as task folders (default
        claweval-tasks/), online-only and unsupported ones refused, each with its own grader.py."""
        from openforge.rollouts.tasks.claweval.importer import import_claweval
        from openforge.rollouts.tasks.importing import write_tasks

        reward = options["reward"]
        report = import_claweval(src, reward=reward)
        refused = [*((task_id, f"online-only: {why}") for task_id, why in report.online_only),
                   *((task_id, f"unsupported: {why}") for task_id, why in report.unsupported)]
        if not report.tasks:
            return ImportResult(tasks=[], written_to="", refused=refused)
        folder = write_tasks(report.tasks, out or "claweval-tasks")
        total = len(report.tasks) + len(refused)
        graded = sum(1 for t in report.tasks if t.get("family"))  # its family payload is its grader.py
        return ImportResult(
            tasks=report.tasks, written_to=str(folder), refused=refused,
            summary=f"{src}: {total} task(s): {len(report.tasks)} imported to {folder}, "
                    f"{len(report.online_only)} online-only, {len(report.unsupported)} unsupported; {graded} imported "
                    "with ClawEval's own grader.py ("
                    + ("its task score is the reward)" if reward == "claweval" else "its scores beside forge's judge's reward)"))

    async def grade(self, grader: RolloutGrading, sb: Sandbox, ro: Rollout, task: TaskSpec, answer: str,
                    site: Any = None, *, services: Any = None) -> Graded:
        from openforge.rollouts.runner.grader import InfraFailure, tail
        from openforge.rollouts.tasks.claweval.grading import ClawEvalGradingFailed, verdict_line
        from openforge.rollouts.tasks.claweval.score import claweval_verdict

        payload = task.payload(ClawEvalPayload)
        assert payload is not None
        spec = payload.grading
        # The files its grader reads, copied out first: the agent is gone, and nothing forge writes for its own
        # graders (the answer file, verifier folders) can stand in for them.
        snapshot = await self._snapshot(grader, sb, task) if spec.snapshot_files else None
        if spec.reward == "judge":
            reward, output, note = await super().grade(grader, sb, ro, task, answer, site, services=services)
        else:  # forge's own judge is not asked: ClawEval's grader asks its judge itself
            from openforge.rollouts.tasks.services import services_summary
            reward, output, note = None, services_summary(services.requests()) if services is not None else "", None
        policy_base = await grader.policy_base(ro) \
            if spec.needs_judge and grader.config.judge.endpoint == "policy-base" else None
        try:
            verdict = await claweval_verdict(grader.config, grader.store, ro, task, answer, services, snapshot,
                                             policy_base=policy_base)
        except ClawEvalGradingFailed as exc:
            raise InfraFailure(str(exc)) from None
        line = verdict_line(verdict, is_reward=reward is None)
        return (float(verdict["task_score"]) if reward is None else reward), tail(f"{output}\n{line}".strip()), note

    @staticmethod
    async def _snapshot(grader: RolloutGrading, sb: Sandbox, task: TaskSpec) -> dict[str, Any]:
        """ClawEval's env_snapshot of the files the task names (its /workspace paths), read from the sandbox's
        working directory: a missing file, a link out or a folder is ClawEval's "not found" entry."""
        from openforge.rollouts.tasks.claweval.grading import snapshot_entry

        payload = task.payload(ClawEvalPayload)
        assert payload is not None
        snapshot = {}
        for name, rel in payload.grading.snapshot_files.items():
            data = await grader.read_expected(sb, rel, SNAPSHOT_MAX_BYTES + 1)
            snapshot[f"file:{name}"] = snapshot_entry(name, data) if data is None or len(data) <= SNAPSHOT_MAX_BYTES \
                else {"error": f"{name} is larger than {SNAPSHOT_MAX_BYTES} bytes"}
        return snapshot

    def idle_run_credited(self, task: TaskSpec) -> bool:
        """ClawEval's task score gives a clean idle run its robustness share (0.2)."""
        payload = task.payload(ClawEvalPayload)
        return payload is not None and payload.grading.reward == "claweval"

    def run_figures(self, store: Store, run_id: str) -> dict[str, Any]:
        from openforge.rollouts.tasks.claweval.score import run_claweval_figures

        return {"claweval": run_claweval_figures(store, run_id)}

    def summary_lines(self, summary: dict[str, Any]) -> list[str]:
        from openforge.rollouts.tasks.claweval.grading import summary_line

        return [summary_line(summary["claweval"])] if summary.get("claweval") else []
