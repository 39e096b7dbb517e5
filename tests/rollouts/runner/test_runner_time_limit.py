"""A harness's time limit charges the policy only for the policy (issue 45): the time its model calls
spend at the proxy and a slow engine is left out, up to a hard cap past which the rollout is infra.

The agents are small Python scripts that call the real proxy in front of a scripted engine made slow
with its `delay` fault (rollouts/runner/policy_clock.py)."""

from __future__ import annotations

import doctest
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from openforge.config import ForgeConfig
from openforge.rollouts.runner import policy_clock
from openforge.rollouts.runner.policy_clock import engine_seconds
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.sandbox.testing import proxy_socket_path
from tests.helpers.proxy_rig import make_rig  # noqa: F401 - fixture
from tests.helpers.runner import ShellHarness, _task

# The agent: N model calls, one after the other, then its work (done.txt) and whatever the shell does next.
AGENT = r"""
import json, os, sys, urllib.request
for _ in range(int(sys.argv[1])):
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    urllib.request.urlopen(urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions", body,
        {"authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "content-type": "application/json"}),
        timeout=120).read()
open("done.txt", "w").write("done")
"""


@pytest.mark.parametrize(("spans", "since", "now", "want"), [
    ([], 0.0, 10.0, 0.0),
    ([(1.0, 3.0)], 0.0, 10.0, 2.0),
    ([(1.0, 3.0), (2.0, 4.0)], 0.0, 10.0, 3.0),  # parallel calls: the engine's time counts once
    ([(1.0, 2.0), (5.0, 6.5)], 0.0, 10.0, 2.5),
    ([(1.0, 5.0), (2.0, 3.0)], 0.0, 10.0, 4.0),  # one inside another
    ([(8.0, None)], 0.0, 10.0, 2.0),  # in flight: until now
    ([(-4.0, 2.0), (9.0, 12.0)], 0.0, 10.0, 3.0),  # clipped to [since, now]
])
def test_engine_seconds(spans: list[tuple[float, float | None]], since: float, now: float, want: float) -> None:
    assert engine_seconds(spans, since=since, now=now) == pytest.approx(want)


def test_policy_clock_docstring_examples() -> None:
    assert doctest.testmod(policy_clock).failed == 0


def _runner(rig: Any, tmp_path: Path, script: str, **runner: Any) -> RolloutRunner:
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    harness = ShellHarness(script.format(agent=f"{sys.executable} {agent}"))
    harness.calls_model = True
    config = ForgeConfig()
    config.sandbox.read_only_paths = [str(tmp_path)]
    for key, value in runner.items():
        setattr(config.runner, key, value)
    return RolloutRunner(rig.store, config=config, proxy_url=rig.url, harness=harness, proxy_socket=rig.proxy.uds)


async def test_a_slow_engine_is_not_the_policys_time(make_rig: Any, tmp_path: Path) -> None:
    """Two calls the engine holds 2.5 s each, against a limit of 3 s: the policy's own time is far less."""
    rig = make_rig(["four"] * 2, uds=Path(proxy_socket_path()))
    for _ in range(2):
        rig.engine.fail_next("delay", seconds=2.5)
    t0 = time.monotonic()
    [ro] = await _runner(rig, tmp_path, "{agent} 2").run(rig.rollout.run_id, [RolloutSpec(_task(time_limit_s=3.0))])
    assert (ro.status, ro.reward, ro.failure_kind) == ("scored", 1.0, None), ro.error
    assert time.monotonic() - t0 > 5.0  # the engine's time did pass on the wall clock
    assert [c.status for c in rig.calls(ro.id)] == ["ok", "ok"]


async def test_a_harness_that_sleeps_on_its_own_is_still_timed_out(make_rig: Any, tmp_path: Path) -> None:
    """A slow call (left out), then the agent's own sleep: the policy's failure at its 2 s, not at the cap."""
    rig = make_rig(["four"], uds=Path(proxy_socket_path()))
    rig.engine.fail_next("delay", seconds=2.5)
    t0 = time.monotonic()
    [ro] = await _runner(rig, tmp_path, "{agent} 1; sleep 60").run(rig.rollout.run_id,
                                                                   [RolloutSpec(_task(time_limit_s=2.0))])
    assert time.monotonic() - t0 < 15  # the cap is 8 s; a killed harness ends well before
    assert (ro.status, ro.reward, ro.failure_kind, ro.exit_code) == ("timed_out", 0.0, "timeout", 124), ro.error
    assert re.search(r"limit of 2s, besides [23]s waiting on the model server", ro.error), ro.error


async def test_a_hung_engine_ends_the_rollout_at_the_cap_as_infra(make_rig: Any, tmp_path: Path) -> None:
    """The engine holds the call past the hard cap (1 s x wall_cap_scale 3): infra, masked, not the policy's 0."""
    rig = make_rig(["four"], uds=Path(proxy_socket_path()))
    rig.engine.fail_next("delay", seconds=60)
    t0 = time.monotonic()
    [ro] = await _runner(rig, tmp_path, "{agent} 1", wall_cap_scale=3.0).run(
        rig.rollout.run_id, [RolloutSpec(_task(time_limit_s=1.0))])
    assert time.monotonic() - t0 < 15
    assert (ro.status, ro.reward, ro.failure_kind) == ("failed", None, "infra"), ro.error
    assert "hard cap of 3s" in ro.error and "waiting on the model server" in ro.error, ro.error
