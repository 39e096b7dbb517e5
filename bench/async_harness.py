"""Asynchronous RL through a real multi-turn harness: `forge up --demo --harness claude-code --headless`
under `trainer.max_staleness = 2` with partial rollouts (`trainer.rollout_versions = 2`), beside the
same run synchronously, and what the store says about each.

The real Claude Code CLI (npm, `$FORGE_NPM_CACHE` or ~/.cache/openforge-npm) in local sandboxes, the
embedded engine serving the warmed-up tiny model, GRPO + LoRA, every adapter hot-loaded: the demo's
two questions (`demo-digit-3`, `demo-digit-8`), 4 rollouts each a step. The tiny model never writes a
tool call, so to make each rollout several model calls Claude Code runs with its own `Stop` hook
(`--settings`, below): at the policy's first answer the hook runs a check (a `sleep`, standing for a
test run or a tool's latency: what a real rollout waits on besides the engine) and sends the agent
back once ("Check it: say the number again."); the second answer ends the rollout and is graded. So
every rollout is two calls, the second extending the first's conversation, with a few seconds between
them during which the trainer may publish a new adapter. Claude Code's prompt is its default one
(`--bare` would skip hooks) with the Bash tool only, ~5.8k tokens with the tiny tokenizer.

Per run, from the store (`facts`): calls per rollout; rollouts whose calls were served by two adapter
versions; that every trained token carries its own call's behaviour logprob and version (the batch the
trainer builds, `trainer.data.build_batch`, against the recorded calls); the staleness histograms the
trainer recorded (groups, tokens) and whether they held the bound; the cap's policy counts
(`rollouts_moved`, `version_capped`, `version_dropped_groups`) and an account of every rollout
(trained, or counted as dropped, or interrupted at the run's end); reward per step; wall time.

    python -m bench async_harness           # 8 steps each
    python -m bench async_harness --quick   # 4 steps each
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HOOK_SLEEP_S = 20
# Claude Code's Stop hook: blocks the first stop (stop_hook_active is false) after a check, lets the second through.
HOOK_COMMAND = (f"grep -q '\"stop_hook_active\": *true' || {{ sleep {HOOK_SLEEP_S}; "
                "echo '{\"decision\": \"block\", \"reason\": \"Check it: say the number again.\"}'; }")
SETTINGS = {"hooks": {"Stop": [{"hooks": [{"type": "command", "command": HOOK_COMMAND}]}]}}
K, N = 2, 2
TASKS, TASKS_PER_STEP, SAMPLES = ["demo-digit-3", "demo-digit-8"], 2, 4
MODES = {"sync": {}, "async_k2": {"trainer.max_staleness": K, "trainer.rollout_versions": N}}


def harness_config() -> str:
    """The forge.toml that runs Claude Code with the Stop hook above (its tools: Bash only)."""
    args = ["--tools", "Bash", "--settings", json.dumps(SETTINGS)]
    return f"[harness]\nextra_args = {json.dumps(args)}\n"


def forge_argv(config: Path, steps: int, overrides: dict[str, Any]) -> list[str]:
    sets = {"tasks.include": json.dumps(TASKS), "trainer.tasks_per_step": TASKS_PER_STEP,
            "runner.samples_per_task": SAMPLES, "runner.concurrency": 16, "trainer.steps": steps, **overrides}
    argv = [sys.executable, "-m", "openforge.forge_cli.main", "-c", str(config)]
    for key, value in sets.items():
        argv += ["--set", f"{key}={value}"]
    return argv + ["up", "--demo", "--harness", "claude-code", "--headless"]


def facts(db: Path, max_staleness: int) -> dict[str, Any]:
    """What the store holds of the newest run in `db` (module doc)."""
    from openforge.store import Store
    from openforge.trainer.checkpoint import adapter_version
    from openforge.trainer.data import build_batch, call_sampling

    store = Store(db)
    run = store.list_runs(limit=1)[0]
    rollouts = store.list_rollouts(run.id)
    calls = [c for c in store.list_calls(run_id=run.id) if c.status == "ok"]
    by_rollout: dict[str, list] = {}
    for c in sorted(calls, key=lambda c: (c.seq, c.id or 0)):
        by_rollout.setdefault(c.rollout_id, []).append(c)
    versions = {rid: {adapter_version(run.id, c.adapter) for c in cs} for rid, cs in by_rollout.items()}
    steps = store.list_train_steps(run.id)
    metrics = [json.loads(s.metrics_json) if isinstance(s.metrics_json, str) else (s.metrics_json or {}) for s in steps]

    def summed(key: str) -> int:
        return sum(int(m.get(key, 0)) for m in metrics)

    def histogram(key: str) -> dict[int, int]:
        total: Counter = Counter()
        for m in metrics:
            total.update({int(k): int(v) for k, v in (m.get(key) or {}).items()})
        return dict(sorted(total.items()))

    # Every trained token's behaviour logprob and version are its own call's: the batch the trainer
    # builds from these rows, checked token by token against the recorded calls.
    scored = [r for r in rollouts if r.status == "scored"]
    trajectories = store.list_trajectories(rollout_ids=[r.id for r in scored])
    batch = build_batch(scored, trajectories, sampling=call_sampling(store, [r.id for r in scored]),
                        max_versions=N if max_staleness else None)
    call_by_id = {c.id: c for c in calls}
    tokens_checked = token_mismatches = 0
    for sample, traj in ((s, t) for s in batch.samples for t in trajectories
                         if t.rollout_id == s.rollout_id and t.segment == s.segment):
        expect_lp = [lp for cid in traj.call_ids for lp in call_by_id[cid].logprobs]
        expect_v = [adapter_version(run.id, call_by_id[cid].adapter) for cid in traj.call_ids
                    for _ in call_by_id[cid].completion_ids]
        got_lp = [lp for lp, m in zip(sample.logprobs, sample.loss_mask) if m]
        got_v = [v for v, m in zip(sample.versions or [], sample.loss_mask) if m]
        tokens_checked += len(expect_lp)
        token_mismatches += sum(a != b for a, b in zip(got_lp, expect_lp)) + abs(len(got_lp) - len(expect_lp))
        token_mismatches += sum(a != b for a, b in zip(got_v, expect_v)) + abs(len(got_v) - len(expect_v))

    status = Counter(r.status for r in rollouts)
    trained = sum(s.n_rollouts for s in steps)
    dropped = summed("failed_groups") + summed("version_dropped_groups") + sum(int(m.get("dropped_groups", 0))
                                                                                for m in metrics)
    rewards = [round(s.reward_mean, 3) if s.reward_mean is not None else None for s in steps]
    group_staleness, token_staleness = histogram("staleness"), histogram("token_staleness")
    return {
        "run": run.id, "status": run.status, "steps": len(steps),
        "rollouts": len(rollouts), "rollout_status": dict(status), "calls": len(calls),
        "calls_per_rollout": dict(sorted(Counter(len(cs) for cs in by_rollout.values()).items())),
        "rollouts_spanning_2_versions": sum(1 for v in versions.values() if len(v) == 2),
        "rollouts_spanning_more": sum(1 for v in versions.values() if len(v) > 2),
        "spanning_trained": summed("spanning_rollouts"),
        "tokens_checked": tokens_checked, "token_mismatches": token_mismatches,
        "group_staleness": group_staleness, "token_staleness": token_staleness,
        "bound_held": all(k <= max_staleness for k in [*group_staleness, *token_staleness]),
        "rollouts_moved": summed("rollouts_moved"), "version_capped": summed("version_capped"),
        "version_dropped_groups": summed("version_dropped_groups"), "failed_groups": summed("failed_groups"),
        "infra_dropped_groups": sum(int(m.get("dropped_groups", 0)) for m in metrics),
        "stale_waits": summed("stale_waits"),
        # every rollout is trained, or in a group counted as dropped, or was cut off when the run ended
        "rollouts_trained": trained, "groups_dropped": dropped,
        "rollouts_unaccounted": len(rollouts) - trained - status.get("interrupted", 0) - dropped * SAMPLES,
        "reward_per_step": rewards,
        "reward_first3_last3": [round(statistics.fmean(r for r in rewards[:3] if r is not None), 3),
                                round(statistics.fmean(r for r in rewards[-3:] if r is not None), 3)],
        "t_train_s": round(sum(s.t_train_s or 0 for s in steps), 1),
        "t_wait_s": round(sum(s.t_rollout_s or 0 for s in steps), 1),
    }


def _one(tmp: Path, name: str, model: Path, config: Path, steps: int) -> dict[str, Any]:
    home = tmp / name
    (home / "models").mkdir(parents=True)
    shutil.copytree(model, home / "models" / "tiny")  # the same warmed-up model, built once
    env = {**os.environ, "FORGE_HOME": str(home)}
    t0 = time.perf_counter()
    out = subprocess.run(forge_argv(config, steps, MODES[name]), env=env, cwd=home, capture_output=True, text=True,
                         timeout=1800)
    wall = round(time.perf_counter() - t0, 1)
    if out.returncode != 0:
        raise RuntimeError(f"forge up ({name}) exited {out.returncode}: {(out.stdout + out.stderr)[-2000:]}")
    f = facts(home / "forge.db", MODES[name].get("trainer.max_staleness", 0))
    f["wall_s"] = wall
    print(f"async_harness {name}: wall {wall} s, {f['rollouts']} rollouts, calls/rollout {f['calls_per_rollout']}, "
          f"spanning 2 versions {f['rollouts_spanning_2_versions']}, staleness groups {f['group_staleness']} "
          f"tokens {f['token_staleness']}, moved {f['rollouts_moved']}, capped {f['version_capped']}, "
          f"unaccounted {f['rollouts_unaccounted']}, reward first 3 -> last 3 {f['reward_first3_last3']}")
    return f


def run(quick: bool = False) -> dict:
    from openforge.config import ForgeConfig
    from openforge.rollouts.harnesses import npm_harness
    from openforge.rollouts.harnesses.npm import find_package_bin
    from openforge.runs.prepare import resolve_model

    cache = Path(os.environ.get("FORGE_NPM_CACHE") or Path.home() / ".cache" / "openforge-npm").expanduser()
    if find_package_bin(cache, "claude-code", npm_harness("claude-code")) is None:
        raise RuntimeError(f"Claude Code is not installed in {cache}: forge harness install claude-code")
    os.environ["FORGE_NPM_CACHE"] = str(cache)
    steps = 4 if quick else 8
    with tempfile.TemporaryDirectory(prefix="forge-bench-async-harness-") as tmp_name:
        tmp = Path(tmp_name)
        model = resolve_model(ForgeConfig(), tmp / "build")  # the demo's warmed-up tiny model
        config = tmp / "claude-code-stop-hook.toml"
        config.write_text(harness_config())
        runs = {name: _one(tmp, name, model, config, steps) for name in MODES}
    runs["async_k2"]["wall_vs_sync"] = round(runs["async_k2"]["wall_s"] / runs["sync"]["wall_s"], 2)
    return {"steps": steps, "tasks": TASKS, "samples_per_task": SAMPLES, "max_staleness": K, "rollout_versions": N,
            "hook_sleep_s": HOOK_SLEEP_S, "runs": runs}


if __name__ == "__main__":
    print(json.dumps(run("--quick" in sys.argv), indent=1))
