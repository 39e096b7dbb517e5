"""One run of a harness in a rollout's sandbox, and how it ended: the sequence a single-run rollout
(rollouts/runner/runner.py) and every step of a multi-step Harbor task (rollouts/runner/steps.py) share.

    run = await run_harness(runner, sb, ro, harness, ctx, budget=budget, env=service_env, site=site)
    run.ending   "timed_out" | "harness" | "policy" | "answer"    run.reason, run.answer, run.result

prepare the harness -> (a GUI task's display attached around this exec only) its command under `budget` of
the policy's time (rollouts/runner/policy_clock.py: the time its model calls spend at the proxy and engine
is left out, up to a hard cap of `budget` x runner.wall_cap_scale, past which it is an InfraFailure) ->
kill_all: nothing the agent started still runs -> the exit code and output recorded on the rollout ->
`before_judging` (the caller's: runner.py withdraws the tools' and services' sockets there) -> the
ending, decided from what the policy cannot write: the sandbox's (or the GUI launcher's) report of
the time limit, then the proxy's record of the calls this run made (its last one failed in the engine
or the proxy: InfraFailure), then the harness's outcome judged against its exit code (failures.py).

A GUI task's browser start (until its page is drawn) and a desktop's start and finish run in the launcher
around the harness (sandbox/gui.py `run --budget`): they get their own time, the harness the whole
`budget`, and the launcher, which keeps that budget from the harness's start, is the one that reports an
overrun, by its exit status (HARNESS_TIMED_OUT). That budget is wall-clock time, engine time included: the
launcher cannot read the proxy's record, and the runner does not know when the harness started in it.
The launcher's output is never read for it: the agent writes to the same stdout and stderr. A launcher
ended by a signal (the agent's processes are the only ones in the sandbox that send any) after the exec
ran past `budget` has made no report: the harness may have overrun, so the run is the policy's failure,
never graded.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from openforge.config import ForgeConfig
from openforge.errors import HarnessError, SandboxError
from openforge.rollouts.harnesses.base import Harness, HarnessContext
from openforge.rollouts.runner.failures import MAX_SIGNAL, context_full_misfit, judge_outcome, prompt_misfit
from openforge.rollouts.runner.grader import InfraFailure, run_in_sandbox, tail
from openforge.rollouts.runner.policy_clock import ClockedRun, PolicyClock, run_on_policy_clock
from openforge.sandbox.base import ExecResult, Sandbox
from openforge.sandbox.gui import HARNESS_TIMED_OUT
from openforge.store import CALL_CLIENT_LEFT, Call, Rollout, Store

Ending = Literal["timed_out", "harness", "policy", "config", "answer"]


@dataclass(frozen=True)
class HarnessRun:
    """How one harness run ended: `timed_out` (past its budget, killed), `harness` (a failure not the
    policy's: `reason`), `policy` (the policy's failure: `reason`), `config` (the run's settings cannot run
    the harness: its own prompt is over the context, failures.prompt_misfit) or `answer` (to be graded)."""

    ending: Ending
    result: ExecResult
    reason: str = ""
    answer: str = ""


class RolloutDriver(Protocol):
    """What a harness run and a multi-step task's steps (steps.py) need of the runner driving the rollout
    (`RolloutRunner` is one): the run's settings and store, the rollout's trajectory assembled from its
    calls (an error, or None), and its ending recorded. A protocol: the runner imports the modules that
    take it, so they do not import the runner back."""

    config: ForgeConfig
    store: Store

    async def _assemble(self, rollout_id: str, harness: Harness) -> str | None: ...

    async def _finish(self, rollout_id: str, *, status: str, only_unfinished: bool = False, **fields: Any) -> None: ...


def engine_fault(call: Call | None) -> str | None:
    """Why `call` (a run's newest) failed in the engine or the proxy; None when it did not. A call
    its client left is no fault of theirs (store.CALL_CLIENT_LEFT): the agent that kills its harness
    mid-answer must not make its own failure look like the infrastructure's."""
    if call is None or call.status not in ("error", "interrupted") or call.error == CALL_CLIENT_LEFT:
        return None
    return (call.error or call.status)[:500]


async def run_harness(runner: RolloutDriver, sb: Sandbox, ro: Rollout, harness: Harness, ctx: HarnessContext, *,
                      budget: float, env: dict[str, str], site: Any = None, step: str | None = None,
                      before_judging: Callable[[], Awaitable[None]] | None = None) -> HarnessRun:
    """Run `harness` once in `sb` under `budget` seconds and classify how it ended (the module's sequence).
    `env`: the task's variables under the harness's own; `step`: a multi-step task's step, named in
    the texts. InfraFailure for what is nobody's policy: a prepare that broke, a display that cannot be
    attached, a sandbox that failed, processes that would not end, an engine fault."""
    config, store = runner.config, runner.store
    try:
        await harness.prepare(sb, ctx)
        command, env = harness.command(ctx), {**env, **harness.env(ctx)}
    except (HarnessError, SandboxError) as exc:
        where = f" for step {step}" if step else ""
        raise InfraFailure(f"harness {harness.name} could not be prepared{where}: {exc}") from None
    spec, timeout = None, budget
    try:
        if site is not None:  # the harness (only) runs in the display, the browser on the site
            spec = site.gui_spec().keeping(budget)
            timeout = spec.exec_timeout(budget)
            if harness.own_browser:  # it starts its own browser in the display, on this page
                env = {**env, "FORGE_START_URL": spec.url or ""}
                spec = dataclasses.replace(spec, url=None)
            sb.attach_gui(spec)
    except SandboxError as exc:
        raise InfraFailure(str(exc)) from None
    before = await asyncio.to_thread(store.list_calls, rollout_id=ro.id)
    clock = PolicyClock(store, ro.id, after_id=(before[-1].id or 0) if before else 0)
    cap = budget * config.runner.wall_cap_scale
    try:
        if spec is not None and spec.budget is not None:  # the launcher keeps the budget, by its own clock
            run = ClockedRun(await run_in_sandbox(config, sb, command, timeout=timeout, env=env), None)
        else:
            run = await run_on_policy_clock(config, sb, command, env=env, budget=budget, cap=cap, clock=clock)
    finally:
        if site is not None:
            sb.attach_gui(None)
    result = run.result
    try:  # nothing the agent started may still run (and rewrite files) while it is graded
        await sb.kill_all()
    except SandboxError as exc:
        raise InfraFailure(f"could not end the agent's processes: {exc}") from None
    await asyncio.to_thread(store.update_rollout, ro.id, exit_code=result.exit_code, stdout=tail(result.stdout),
                            stderr=tail(result.stderr))
    if before_judging is not None:
        await before_judging()
    prefix = f"step {step}: " if step else ""
    if run.ended_by == "cap" and clock.policy_s < budget:  # the engine held it: never the policy's 0
        raise InfraFailure(f"{prefix}the harness reached the hard cap of {cap:g}s (runner.wall_cap_scale), "
                           f"{clock.engine_s:.0f}s of it waiting on the model server; the policy's own time "
                           f"{clock.policy_s:.0f}s of its limit of {budget:g}s")
    if result.timed_out or (spec is not None and spec.budget is not None and result.exit_code == HARNESS_TIMED_OUT):
        waited = f", besides {clock.engine_s:.0f}s waiting on the model server" if clock.engine_s >= 1 else ""
        return HarnessRun("timed_out", result, f"{prefix}harness ran past its limit of {budget:g}s{waited} "
                          "and was killed")
    if spec is not None and spec.budget is not None and 128 < result.exit_code <= 128 + MAX_SIGNAL \
            and result.duration_s > budget:
        return HarnessRun("policy", result, f"{prefix}the display's launcher was killed by signal "
                          f"{result.exit_code - 128} after {result.duration_s:.0f}s, before it reported the "
                          f"harness's time (its limit {budget:g}s), not by the runner")
    calls = (await asyncio.to_thread(store.list_calls, rollout_id=ro.id))[len(before):]
    last_call = calls[-1] if calls else None
    if broken_call := engine_fault(last_call):  # the engine/proxy failed the harness: not the policy's data
        raise InfraFailure(f"step {step}: the last model call failed: {broken_call}" if step
                           else f"the rollout's last model call failed: {broken_call}")
    if misfit := prompt_misfit(harness.name, calls):  # whatever the harness made of the 400s: not the policy's 0
        return HarnessRun("config", result, prefix + misfit)
    try:
        reported = await harness.outcome(result, sb)
    except SandboxError as exc:
        raise InfraFailure(f"reading the harness's result failed: {exc}") from None
    if misfit := context_full_misfit(harness.name, reported, calls):  # it never sent it: not the policy's 0
        return HarnessRun("config", result, prefix + misfit)
    outcome = judge_outcome(reported, harness=harness.name, exit_code=result.exit_code,
                            calls_model=harness.calls_model, answered=any(c.status == "ok" for c in calls),
                            last_call=last_call)
    if outcome.failure is not None:  # never scored: its error text is not an answer
        return HarnessRun("harness", result, prefix + outcome.failure)
    if outcome.policy_failure is not None:  # the policy's 0, not graded: its output is no answer either
        return HarnessRun("policy", result, prefix + outcome.policy_failure)
    return HarnessRun("answer", result, answer=outcome.answer or "")
