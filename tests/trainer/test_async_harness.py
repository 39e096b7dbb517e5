"""Partial rollouts through a real multi-turn harness: `forge up --demo --harness claude-code --headless`
under `trainer.max_staleness = 2`, `trainer.rollout_versions = 2`, checked in the store.

The tiny model never writes a tool call, so each Claude Code rollout is made two calls by Claude Code's
own `Stop` hook: at the first answer it runs a check and sends the agent back once. The check takes as
long as the task's `check_seconds` file says: the fast task's none, the slow task's 25 s (a test run, a
tool's latency). One task a step, both started under the base model (version 0): step 0 trains the fast
group and publishes the step-0 adapter (version 1) while the slow group's rollouts wait in their check,
so their second calls are served by version 1. What the store must then hold: the slow rollouts' calls
span versions 0 and 1, each trained token carries its own call's version and behaviour logprob, the
staleness bound held, and every rollout is accounted for (trained; nothing dropped or held at the cap).
The same facts over a longer run, beside a synchronous one: `python -m bench async_harness`
(docs/trainer.md, "A multi-turn harness under K = 2")."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from openforge.store import Store
from openforge.trainer.checkpoint import adapter_version
from openforge.trainer.data import build_batch, call_sampling
from tests.helpers.harnesses import NPM_CACHE, needs
from tests.helpers.up import forge

SLOW_CHECK_S = 25  # well over a training step of one group and its publish here (~2-8 s on 2 loaded cores)
HOOK = ("grep -q '\"stop_hook_active\": *true' || { sleep \"$(cat check_seconds 2>/dev/null || echo 0)\"; "
        "echo '{\"decision\": \"block\", \"reason\": \"Check it: say the number again.\"}'; }")
TASKS = [{"id": "fast", "instruction": "What is 1 + 2? Answer with a number.", "expect_answer": {"number": 3}},
         {"id": "slow", "instruction": "What is 4 + 4? Answer with a number.", "expect_answer": {"number": 8},
          "files": {"check_seconds": str(SLOW_CHECK_S)}}]


def _config(home: Path) -> Path:
    tasks = home / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    settings = {"hooks": {"Stop": [{"hooks": [{"type": "command", "command": HOOK}]}]}}
    config = home / "forge.toml"
    args = ["--tools", "Bash", "--settings", json.dumps(settings)]
    config.write_text(f"[harness]\nextra_args = {json.dumps(args)}\n")
    return config


def _sets(home: Path) -> list[str]:
    """The run's settings: as --set items, which lie over the demo's presets (a config file lies under them)."""
    sets = {"tasks.path": str(home / "tasks.jsonl"), "tasks.include": "[]", "runner.samples_per_task": 2,
            "runner.concurrency": 4, "trainer.steps": 2, "trainer.tasks_per_step": 1, "trainer.max_staleness": 2,
            "trainer.rollout_versions": 2}
    return [arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]


@pytest.mark.slow
@pytest.mark.timeout(600)
@needs("claude-code")
def test_claude_code_rollouts_span_two_versions_under_k2(forge_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORGE_NPM_CACHE", str(NPM_CACHE))
    out = forge(forge_home, "-c", str(_config(forge_home)), *_sets(forge_home),
                "up", "--demo", "--harness", "claude-code", "--headless", timeout=540)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    store = Store(forge_home / "forge.db")
    run = store.list_runs(limit=1)[0]
    assert run.status == "finished"
    rollouts = store.list_rollouts(run.id)
    assert sorted(r.task_id for r in rollouts) == ["fast", "fast", "slow", "slow"]
    assert all(r.status == "scored" and r.failure_kind is None for r in rollouts), \
        [(r.status, r.error) for r in rollouts]

    calls = {c.id: c for c in store.list_calls(run_id=run.id) if c.status == "ok"}
    version = {cid: adapter_version(run.id, c.adapter) for cid, c in calls.items()}
    step0 = f"{run.id}-step-0"
    for r in rollouts:  # two calls each (three if Claude Code retried an empty answer), and who served them
        mine = sorted((c for c in calls.values() if c.rollout_id == r.id), key=lambda c: c.seq)
        served = [version[c.id] for c in mine]
        assert len(mine) >= 2 and all(c.api == "anthropic_messages" for c in mine)
        if r.task_id == "slow":  # the base model before the check, step 0's adapter after it
            assert served[0] == 0 and served[-1] == 1 and served == sorted(served), served
            assert r.adapter == step0  # moved at step 0's publish
        else:
            assert set(served) == {0} and r.adapter is None, served

    # Each trained token carries its own call's behaviour logprob and version: the batch the trainer
    # builds from the store, token by token against the recorded calls its segment lists.
    trajs = store.list_trajectories(rollout_ids=[r.id for r in rollouts])
    batch = build_batch(rollouts, trajs, sampling=call_sampling(store, [r.id for r in rollouts]), max_versions=2)
    assert batch.spanning_rollouts == 2 and batch.version_dropped_groups == 0 and batch.n_groups == 2
    segments = {(t.rollout_id, t.segment): t.call_ids for t in trajs}
    assert {s.rollout_id for s in batch.samples} == {r.id for r in rollouts}
    behind: Counter = Counter()  # step 1 trains the slow group: its tokens by versions behind
    for s in batch.samples:
        cids = segments[(s.rollout_id, s.segment)]
        assert [lp for lp, m in zip(s.logprobs, s.loss_mask) if m] == [lp for c in cids for lp in calls[c].logprobs]
        assert [v for v, m in zip(s.versions, s.loss_mask) if m] == \
            [version[c] for c in cids for _ in calls[c].completion_ids]
        if s.task_id == "slow":
            behind.update(str(1 - v) for v, m in zip(s.versions, s.loss_mask) if m)

    # What the trainer recorded: step 1 trained the slow group, started one version back, the tokens
    # of its first calls one version behind and of its last none; the bound (2) held; step 0's publish
    # moved the two slow rollouts and held none at the cap; all four rollouts were trained.
    steps = store.list_train_steps(run.id)
    m = [json.loads(s.metrics_json) if isinstance(s.metrics_json, str) else s.metrics_json for s in steps]
    assert [s.step for s in steps] == [0, 1] and [s.n_rollouts for s in steps] == [2, 2]
    assert m[0]["staleness"] == {"0": 1} and m[1]["staleness"] == {"1": 1}
    assert m[1]["token_staleness"] == dict(sorted(behind.items())) and set(behind) == {"0", "1"}
    assert (m[1]["spanning_rollouts"], m[1]["rollouts_moved"], m[1]["version_capped"]) == (2, 2, 0)
    assert sum(x["version_dropped_groups"] + x["failed_groups"] + x["dropped_groups"] for x in m) == 0
