"""`forge tasks validate --run`: prove a task set's verifiers work, in real sandboxes.

Each task with a reference `solution` runs twice through the rollout runner: once with the solution
as the "agent" (its reward must reach `pass_threshold`) and once with an agent that does nothing (it
must not). A verifier that passes an empty attempt, or fails the reference solution, is a task bug
that would otherwise show up as a flat reward curve.
"""

from __future__ import annotations

from collections.abc import Sequence

from openforge.config import ForgeConfig
from openforge.store import Store
from rollouts.harness import HarnessContext
from rollouts.runner import RolloutRunner, RolloutSpec
from rollouts.tasks import TaskProblem, TaskSpec
from sandbox.base import Sandbox

WHERE = "solution check"


class _ScriptHarness:
    """Runs a fixed shell script per task id instead of an agent."""

    name = "solution"

    def __init__(self, scripts: dict[str, str]) -> None:
        self.scripts = scripts

    async def prepare(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
        return None

    def command(self, ctx: HarnessContext) -> list[str]:
        return ["sh", "-c", self.scripts.get(ctx.task_id, "true")]

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {}


async def check_solutions(store: Store, config: ForgeConfig, tasks: Sequence[TaskSpec]) -> list[TaskProblem]:
    """Every task whose verifier fails its reference solution or passes an empty attempt."""
    with_solution = [t for t in tasks if t.solution]
    problems = [TaskProblem(WHERE, t.id, "no reference solution: its verifier is unchecked (add `solution`)")
                for t in tasks if not t.solution]
    run = store.create_run(kind="check", name="tasks validate --run")
    store.set_run_status(run.id, "running")
    for label, scripts in (("solved", {t.id: t.solution or "true" for t in with_solution}), ("empty", {})):
        runner = RolloutRunner(store, config=config, proxy_url="http://127.0.0.1:9", harness=_ScriptHarness(scripts))
        out = await runner.run(run.id, [RolloutSpec(t) for t in with_solution], step=0 if label == "solved" else 1)
        for task, ro in zip(with_solution, out):
            if ro.status != "scored":
                problems.append(TaskProblem(WHERE, task.id, f"{label} attempt ended {ro.status}: {ro.error}"))
            elif label == "solved" and (ro.reward or 0.0) < task.pass_threshold:
                problems.append(TaskProblem(WHERE, task.id, f"the reference solution scores {ro.reward:g} < "
                                            f"pass_threshold {task.pass_threshold:g}: {_last(ro.verifier_output)}"))
            elif label == "empty" and (ro.reward or 0.0) >= task.pass_threshold:
                problems.append(TaskProblem(WHERE, task.id, f"an agent that does nothing passes (reward {ro.reward:g})"))
    store.set_run_status(run.id, "finished")
    return problems


def _last(output: str | None) -> str:
    lines = [ln for ln in (output or "").splitlines() if ln.strip()]
    return lines[-1][:120] if lines else "(no verifier output)"
