"""bench/compaction.py: its Codex settings, and its shortest run through the real Codex CLI, read
back from each arm's store."""

from __future__ import annotations

import tomllib

import pytest

from bench import compaction
from tests.helpers.harnesses import NPM_CACHE, needs


def test_each_arm_runs_codex_with_the_stop_hook_and_its_own_context_window():
    for arm, window in compaction.ARMS.items():
        args = tomllib.loads(compaction.harness_config(window))["harness"]["extra_args"]
        assert args[0] == "--dangerously-bypass-hook-trust"  # Codex skips an unreviewed hook without it
        overrides = {}
        for value in args[2::2]:  # each `-c key=value` is a TOML line to Codex
            overrides |= tomllib.loads(value)
        [group] = overrides["hooks"]["Stop"]
        assert group["hooks"] == [{"type": "command", "command": compaction.HOOK_COMMAND}]
        assert overrides["model_context_window"] == window
        # ON compacts after a ~23.6k-token turn, OFF never does
        threshold = window * overrides["model_post_turn_compact_threshold_percent"] / 100
        assert (threshold < 23_600) == (arm == "on")


def test_side_by_side_has_a_row_a_step_and_a_blank_where_an_arm_stopped_early():
    on = {"reward_per_step": [0.0, 0.5], "trained_tokens_per_step": [9, 10], "trained_tokens_per_s": [0.3, 0.4]}
    off = {"reward_per_step": [0.25], "trained_tokens_per_step": [7], "trained_tokens_per_s": [0.3]}
    rows = compaction.side_by_side(on, off)
    assert [(r["step"], r["reward on"], r["reward off"]) for r in rows] == [(0, 0.0, 0.25), (1, 0.5, None)]
    assert rows[1]["trained tokens off"] is None and rows[1]["trained tokens on"] == 10


@pytest.mark.slow
@pytest.mark.timeout(600)
@needs("codex")
def test_the_shortest_run_compacts_every_rollout_on_and_none_off(monkeypatch):
    """1 step, 2 rollouts an arm (60 s on 2 idle cores, 140 s under load: the model's build and two 24k-token
    train steps): every figure is read from the arm's store."""
    monkeypatch.setenv("FORGE_NPM_CACHE", str(NPM_CACHE))
    result = compaction.run(quick=True)
    on, off = result["arms"]["on"], result["arms"]["off"]
    for arm in (on, off):
        assert arm["status"] == "finished" and arm["steps"] == 1 and arm["rollout_status"] == {"scored": 2}
        assert arm["trained_equals_sampled"] and arm["trained_tokens"] == sum(arm["trained_tokens_per_step"])
        assert arm["reward_per_step"][0] in (0.0, 0.5, 1.0)
    # ON: every rollout two answers and Codex's summary request, its own labelled segment
    assert on["compacted_fraction"] == 1.0 and on["summary_calls"] == on["compaction_breaks"] == 2
    assert (on["calls_per_rollout"], on["segments_per_rollout"]) == (3.0, 2.0)
    # OFF: the same two answers, no compaction anywhere
    assert off["compacted_fraction"] == 0.0 and off["summary_calls"] == off["compaction_breaks"] == 0
    assert (off["calls_per_rollout"], off["segments_per_rollout"]) == (2.0, 1.0)
    assert on["tokens_ran_per_rollout"] > off["tokens_ran_per_rollout"]  # the summary request's prompt too
    assert [r["step"] for r in result["per_step"]] == [0] and result["on_vs_off"]["wall_s"] > 0
