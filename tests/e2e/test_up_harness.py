"""`forge up --demo --harness claude-code`, short: the real Claude Code CLI in local sandboxes against
the embedded engine serving the long-context tiny model, two GRPO steps with a LoRA hot-load.

What it proves, on the recorded data: every call is Claude Code's real ~48k-token prompt, every
trajectory's sampled tokens are exactly the engine's completion tokens, the rollouts of a step share
their prompt's first 44k tokens (the same sandbox paths, no per-task billing header: what lets the
engine's prefix cache and the trainer's shared-prefix step compute it once), the second step is
served by the first step's adapter, and every rollout finishes (none failed) with a reward that is an
exact grade of Claude Code's own answer.
The full demo and its curve are in docs/dashboard.md ("With a real harness")."""

from __future__ import annotations

from pathlib import Path

import pytest

from openforge.store import Store
from tests.helpers.harnesses import NPM_CACHE, needs
from tests.helpers.up import forge, served_with_adapter

SHARED_PREFIX_MIN = 44_000  # Claude Code 2.1's system prompt + tools with the tiny tokenizer: ~44.4k


def _common(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@pytest.mark.slow
@pytest.mark.timeout(900)
@needs("claude-code")
def test_demo_through_the_real_claude_code(forge_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORGE_NPM_CACHE", str(NPM_CACHE))
    out = forge(forge_home, "--set", "runner.samples_per_task=2", "--set", "runner.concurrency=2",
                "up", "--demo", "--harness", "claude-code", "--headless", "--steps", "2", timeout=840)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    store = Store(forge_home / "forge.db")
    run = store.list_runs(limit=1)[0]
    assert run.status == "finished" and run.isolation.startswith("bwrap")
    assert (run.config_json or {})["harness"]["name"] == "claude-code"
    assert len(store.list_train_steps(run.id)) == 2

    for step in (0, 1):
        rollouts = store.list_rollouts(run.id, step=step)
        assert len(rollouts) == 2  # easy-sum x 2: a group of two shares its prefix as a group of four does
        for r in rollouts:
            # Every rollout finishes and is graded exactly from Claude Code's own result: a failed one
            # (a harness error, a timeout) is a broken loop here, not a reward of 0.
            # (nor a policy failure: the demo's answers fit Claude Code's limits)
            assert r.status == "scored" and r.failure_kind is None and r.reward in (0.0, 1.0), (r.status, r.reward,
                                                                                                r.error)
        calls = [c for c in store.list_calls(run_id=run.id) if c.rollout_id in {r.id for r in rollouts}]
        assert calls and all(c.api == "anthropic_messages" and c.prompt_tokens > SHARED_PREFIX_MIN for c in calls)
        firsts = [c.prompt_ids for c in calls if c.seq == 0]
        assert min(_common(firsts[0], p) for p in firsts[1:]) >= SHARED_PREFIX_MIN
        for r in rollouts:  # the trained tokens are the sampled tokens, exactly
            sampled = [t for c in sorted((c for c in calls if c.rollout_id == r.id and c.status == "ok"),
                                         key=lambda c: c.seq) for t in c.completion_ids]
            trajs = store.list_trajectories(rollout_ids=[r.id])
            trained = [t for tr in trajs for t, m in zip(tr.token_ids, tr.loss_mask) if m]
            assert trained == sampled
    assert served_with_adapter(store, run.id, 1, f"{run.id}-step-0")  # step 1 ran on step 0's adapter

