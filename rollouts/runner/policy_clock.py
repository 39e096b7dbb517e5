"""A harness run's time limit, charged to the policy only for the policy's time.

    clock = PolicyClock(store, rollout_id, after_id=last_call_id_before_the_run)
    run = await run_on_policy_clock(config, sb, command, env=env, budget=120, cap=480, clock=clock)
    run.ended_by   None (exited by itself) | "policy" (its time spent) | "cap" (the hard cap)

The policy's time is the run's wall-clock time less its engine time: the union of the spans its model
calls spent at the proxy (from the request's arrival, its wait for a call slot included, to the
recorded answer: the call rows' started_at and ended_at), where it waited behind other rollouts' calls
or for tokens decoded slowly on a loaded machine. The harness runs with the sandbox's limit at `cap`;
this clock ends it earlier, with `Sandbox.kill_all`, once the policy's time reaches `budget` and none of
its calls is in flight: a harness is never killed while the proxy serves one of its calls. The cap ends
a run the engine holds for good (a hung engine): the runner makes that an infra failure, not the
policy's 0 (rollouts/runner/harness_run.py).

The clock reads the store (two columns of the rollout's newest calls) when the policy's time could next
run out, and every POLL_S while a call is in flight; the proxy may be in another process.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from openforge.config import ForgeConfig
from openforge.errors import SandboxError
from openforge.rollouts.runner.grader import KILL_GRACE_S, run_in_sandbox
from openforge.sandbox.base import ExecResult, Sandbox, stop_shielded
from openforge.store import Store

POLL_S = 0.5  # how often the clock looks again while a call is in flight (it may end at any moment)
MIN_WAIT_S = 0.05


def engine_seconds(spans: Sequence[tuple[float, float | None]], *, since: float, now: float) -> float:
    """Seconds of [since, now] during which at least one call was at the proxy: the union of the spans
    (start, end), an open span (end None: in flight) running to `now`. Parallel calls count once.

    >>> engine_seconds([(1.0, 3.0), (2.0, 4.0), (6.0, None)], since=0.0, now=7.0)
    4.0
    >>> engine_seconds([(-5.0, 1.0), (2.0, 9.0)], since=0.0, now=5.0)  # clipped to [since, now]
    4.0
    """
    total, reach = 0.0, since
    for start, end in sorted((max(s, since), min(now if e is None else e, now)) for s, e in spans):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def _epoch(t: datetime) -> float:
    return (t if t.tzinfo is not None else t.replace(tzinfo=UTC)).timestamp()  # SQLite gives naive UTC


class PolicyClock:
    """The policy's and the engine's seconds of one harness run, from the proxy's record of its calls
    (those with id > `after_id`: earlier steps' calls are not this run's)."""

    def __init__(self, store: Store, rollout_id: str, *, after_id: int = 0) -> None:
        self.store, self.rollout_id, self.after_id = store, rollout_id, after_id
        self.since = datetime.now(UTC).timestamp()
        self.policy_s = self.engine_s = 0.0

    async def read(self) -> bool:
        """Update `policy_s` and `engine_s` to now; True while one of the run's calls is in flight."""
        spans = await asyncio.to_thread(self.store.call_spans, rollout_id=self.rollout_id, after_id=self.after_id)
        now = datetime.now(UTC).timestamp()
        self.engine_s = engine_seconds([(_epoch(s), None if e is None else _epoch(e)) for s, e in spans],
                                       since=self.since, now=now)
        self.policy_s = max(0.0, now - self.since - self.engine_s)
        return any(e is None for _, e in spans)


@dataclass(frozen=True)
class ClockedRun:
    result: ExecResult
    ended_by: Literal["policy", "cap"] | None  # None: the harness exited by itself


async def run_on_policy_clock(config: ForgeConfig, sb: Sandbox, command: list[str] | str, *, env: dict[str, str],
                              budget: float, cap: float, clock: PolicyClock) -> ClockedRun:
    """Run `command` in `sb` until it exits, the policy's time reaches `budget` with no call in flight
    (every process of the sandbox killed: exit code 124, as a timeout), or the wall clock reaches `cap`."""
    running = asyncio.ensure_future(run_in_sandbox(config, sb, command, timeout=cap, env=env))
    try:
        while True:
            in_flight = await clock.read()
            left = budget - clock.policy_s
            if left <= 0 and not in_flight:
                break
            # The policy's time runs no faster than the wall clock: nothing to check before `left` has passed.
            wait = POLL_S if in_flight else max(left, MIN_WAIT_S)
            done, _ = await asyncio.wait({running}, timeout=wait)
            if done:
                await clock.read()
                result = running.result()
                return ClockedRun(result, "cap" if result.timed_out else None)
        try:
            await sb.kill_all()
            result = await asyncio.wait_for(asyncio.shield(running), KILL_GRACE_S)
        except (SandboxError, TimeoutError):  # the sandbox cannot end them: nothing it holds may go on
            await stop_shielded(sb)
            result = ExecResult(exit_code=124, stdout="", stderr="killed: the sandbox did not end the harness",
                                timed_out=True)
        return ClockedRun(dataclasses.replace(result, exit_code=124, timed_out=True), "policy")
    finally:
        if not running.done():
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
