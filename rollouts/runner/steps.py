"""A multi-step task's rollout: one sandbox, one harness run per step, each step graded after it.

    for each step (a task kind's steps: Harbor's [[steps]], rollouts/tasks/harbor/kind.py):
        the harness runs afresh in the same sandbox, given the step's instruction (HarnessContext.step
          names it), under the step's time limit
        kill_all: nothing the agent started still runs
        the step graded by the kind's `grade_step` (Harbor's: the step's tests copied in and run, the reward
          read on the host), then the grader's folder emptied (`Sandbox.grader_folder`), as Harbor empties
          /tests and /logs/verifier before the next agent phase
        a reward below the step's min_reward: the remaining steps are skipped
    the rollout's reward: the kind's `combine` of the graded steps' rewards (Harbor's mean, or final)

Every model call of every step is made with the rollout's key, so the proxy records them all under
the one rollout and the trajectory is assembled once, at the end (a fresh session starts a new
segment: rollouts/runner/trajectory.py). Each step's run and its ending are a single run's
(rollouts/runner/harness_run.py, judged on the calls the step made):
a step whose harness failed fails the rollout ("harness", never scored); a step's policy failure or
timeout ends it with reward 0.0 whatever earlier steps scored (a policy that stops working mid-task
earns nothing, as one that times out on a task of one step); a grader that cannot run is infra.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from openforge.errors import SandboxError
from openforge.rollouts.harnesses.base import Harness, HarnessContext
from openforge.rollouts.runner.failures import failure_fields
from openforge.rollouts.runner.grader import InfraFailure, tail
from openforge.rollouts.runner.harness_run import RolloutDriver, run_harness
from openforge.sandbox.base import Sandbox
from openforge.store import Rollout


class Step(Protocol):
    """One step of a multi-step task, as a task kind gives it."""

    name: str
    instruction: str
    time_limit_s: float
    min_reward: float | None


async def drive_steps(runner: RolloutDriver, sb: Sandbox, ro: Rollout, harness: Harness, ctx: HarnessContext,
                      extra_env: dict[str, str], *, steps: Sequence[Step],
                      grade_step: Callable[[Step, str], Awaitable[tuple[float, str, str | None]]],
                      combine: Callable[[list[float]], float], rule: str) -> None:
    """Run every step in `sb`, grade each with `grade_step(step, answer)`, and record the rollout's ending:
    `combine` of the graded steps' rewards (`rule` names it in the output)."""
    config = runner.config
    rewards: list[float] = []
    lines: list[str] = []
    notes: list[str] = []
    for step in steps:
        budget = min(step.time_limit_s * config.runner.time_limit_scale, config.runner.rollout_timeout_s)
        step_ctx = dataclasses.replace(ctx, instruction=step.instruction, step=step.name)
        run = await run_harness(runner, sb, ro, harness, step_ctx, budget=budget, env=extra_env, step=step.name)
        if run.ending == "timed_out":
            await _end(runner, ro, harness, lines, status="timed_out", reward=0.0, failure_kind="timeout",
                       error=run.reason)
            return
        if run.ending in ("harness", "config"):
            await _end(runner, ro, harness, lines, status="failed", **failure_fields(run.ending, run.reason))
            return
        if run.ending == "policy":
            await _end(runner, ro, harness, lines, status="scored", reward=0.0, **failure_fields("policy", run.reason))
            return
        reward, output, note = await grade_step(step, run.answer)
        rewards.append(reward)
        lines.append(f"== step {step.name}: reward {reward:g}\n{tail(output, 2000)}")
        if note:
            notes.append(f"step {step.name}: {note}")
        if step.min_reward is not None and reward < step.min_reward:
            lines.append(f"== step {step.name}: reward {reward:g} < min_reward {step.min_reward:g}: "
                         "later steps skipped")
            break
        try:  # the next step's agent must not find these tests: the grader's folder emptied
            await sb.grader_folder()
        except SandboxError as exc:
            raise InfraFailure(f"could not clear step {step.name}'s tests: {exc}") from None
    reward = combine(rewards)
    lines.append(f"== {rule} of {len(rewards)} graded step(s): {reward:g}")
    await _end(runner, ro, harness, lines, status="scored", reward=reward, error="; ".join(notes) or None)


async def _end(runner: RolloutDriver, ro: Rollout, harness: Harness, lines: list[str], *, status: str,
               **fields: object) -> None:
    """Assemble the trajectory of every step's calls, then record the ending (assembly failed: infra)."""
    output = tail("\n".join(lines)) if lines else None
    if assembly_error := await runner._assemble(ro.id, harness):
        fields = {**fields, **failure_fields("infra", f"trajectory assembly failed: {assembly_error}")}
        status = "failed"
    await runner._finish(ro.id, status=status, verifier_output=output, **fields)
