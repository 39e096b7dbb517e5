"""Learning with the harness's compaction on vs off: `forge up --demo --harness codex --headless` twice,
the same seed, tasks and steps, once with Codex compacting its context in every rollout and once with a
context long enough that it never does; reward per step, compactions, segments and trained tokens side
by side, read from each run's store (issue 47).

The real Codex CLI (0.171, npm, `$FORGE_NPM_CACHE` or ~/.cache/openforge-npm) in local sandboxes, the
embedded engine serving the demo's warmed-up tiny model, GRPO + LoRA, every adapter hot-loaded, with
`forge up --demo --harness codex`'s own settings (openforge/presets/demo-codex.toml): `easy-sum`
("What is 2 + 3? Answer with the number."), 16 samples a step, graded exactly (`5` or nothing), at
most 2 tokens a call. What the tiny model learns there is to say `5` to this prompt, not arithmetic
(docs/dashboard.md, "With a real harness"). The tiny model never writes a tool call, so the long
horizon is the harness's own: Codex's ~23.5k-token prompt (tiny tokenizer), and a `Stop` hook
(`--dangerously-bypass-hook-trust`: Codex runs an unreviewed hook only with it) that sends the agent
back once ("Check it: say the number again."), so every rollout is two turns of one conversation and
its second answer is graded.

Where Codex compacts, measured on 0.171 with a scripted policy: mid-turn only when the usage passes
`model_auto_compact_token_limit` *and* the turn goes on after a tool call (a Stop hook's continuation
does not trigger it, nor does Claude Code 2.1.197's auto-compact on one); after the turn when the
usage passes `model_post_turn_compact_threshold_percent` of `model_context_window`. So here:

- ON: `model_context_window=34000`, post-turn threshold 50% (17k): every rollout ends with Codex's
  summary request (the whole history, its CONTEXT CHECKPOINT COMPACTION prompt, tools withdrawn), the
  policy's own sampled summary, recorded as the harness's call (`side = "compaction"`), its own
  segment, trained with the rollout's reward.
- OFF: `model_context_window=131072`, the same 50% (65k): never reached, one segment a rollout.

The graded answer comes before the summary, so this measures what training the harness's compaction
costs and whether it disturbs learning, not a policy that must answer from its own summary (that needs
a model that writes tool calls: docs/harnesses.md, "Learning with compaction on vs off", has the runs).

Per arm, from the store (`facts`): reward per step; the fraction of scored rollouts with a summary call
and breaks labelled `compaction`; segments per rollout; trained tokens per step (the trainer's
`n_tokens`, sampled tokens under the loss mask) and trained tokens/s (over the step's train time),
tokens the trainer ran per step (prompts included); that trained tokens = sampled tokens (the batch the
trainer builds from the store against the recorded calls); wall time. The ON/OFF ratios are of this run.

    python -m bench compaction           # 8 steps each arm, 16 samples a step
    python -m bench compaction --quick   # 1 step each arm, 2 samples
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

# Codex's Stop hook: the first stop is blocked (stop_hook_active is false), the second is let through.
HOOK_COMMAND = ("grep -q '\"stop_hook_active\": *true' || "
                "echo '{\"decision\": \"block\", \"reason\": \"Check it: say the number again.\"}'")
POST_TURN_PERCENT = 50
ARMS = {"on": 34_000, "off": 131_072}  # model_context_window: 50% of it is below / above the ~23.6k used
TASKS = ["easy-sum"]


def harness_config(context_window: int) -> str:
    """The forge.toml of one arm: Codex with the Stop hook and this context window."""
    hook = 'hooks.Stop=[{hooks=[{type="command",command=%s}]}]' % json.dumps(HOOK_COMMAND)
    args = ["--dangerously-bypass-hook-trust", "-c", hook, "-c", f"model_context_window={context_window}",
            "-c", f"model_post_turn_compact_threshold_percent={POST_TURN_PERCENT}"]
    return f"[harness]\nextra_args = {json.dumps(args)}\n"


def forge_argv(config: Path, steps: int, tasks: list[str], samples: int) -> list[str]:
    sets = {"tasks.include": json.dumps(tasks), "trainer.tasks_per_step": len(tasks),
            "runner.samples_per_task": samples, "runner.concurrency": 16, "trainer.steps": steps,
            "trainer.seed": 0, "engine.seed": 0}
    argv = [sys.executable, "-m", "openforge.forge_cli.main", "-c", str(config)]
    for key, value in sets.items():
        argv += ["--set", f"{key}={value}"]
    return argv + ["up", "--demo", "--harness", "codex", "--headless"]


def facts(db: Path) -> dict[str, Any]:
    """What the store holds of the newest run in `db` (module doc)."""
    from openforge.proxy import breaks
    from openforge.store import Store
    from openforge.trainer.data import build_batch, call_sampling

    store = Store(db)
    run = store.list_runs(limit=1)[0]
    rollouts = store.list_rollouts(run.id)
    scored = [r for r in rollouts if r.status == "scored"]
    every_call = store.list_calls(run_id=run.id)
    calls = [c for c in every_call if c.status == "ok"]
    by_rollout: dict[str, list] = {}
    for c in calls:
        by_rollout.setdefault(c.rollout_id, []).append(c)
    # A rollout compacted when Codex's summary request is recorded as its own call and labelled as a
    # compaction break (post-turn, nothing follows the summary, so there is no replay to label).
    compacted = [r for r in scored if any(c.side == "compaction" and c.break_reason == breaks.SUMMARY_ASKED
                                          for c in by_rollout.get(r.id, []))]
    steps = store.list_train_steps(run.id)

    # Trained tokens = sampled tokens: the batch the trainer builds from the store holds, under its loss
    # mask, exactly the tokens the engine sampled for the scored rollouts' calls.
    trajectories = store.list_trajectories(rollout_ids=[r.id for r in scored])
    batch = build_batch(scored, trajectories, sampling=call_sampling(store, [r.id for r in scored]))
    in_batch = {s.rollout_id for s in batch.samples}
    trained = sum(sum(s.loss_mask) for s in batch.samples)
    sampled = sum(len(c.completion_ids) for c in calls if c.rollout_id in in_batch)
    ran = sum(len(s.token_ids) for s in batch.samples)

    rewards = [round(s.reward_mean, 3) if s.reward_mean is not None else None for s in steps]
    known = [r for r in rewards if r is not None]
    return {
        "run": run.id, "status": run.status, "steps": len(steps), "rollouts": len(rollouts),
        "rollout_status": dict(Counter(r.status for r in rollouts)),
        "compacted_fraction": round(len(compacted) / max(len(scored), 1), 3),
        "summary_calls": sum(1 for c in calls if c.side == "compaction"),
        "summary_calls_not_ok": dict(Counter(c.status for c in every_call if c.side == "compaction" and c.status != "ok")),
        "compaction_breaks": sum(1 for c in calls if (c.break_reason or "").startswith("compaction")),
        "calls_per_rollout": round(len(calls) / max(len(by_rollout), 1), 2),
        "segments_per_rollout": round(statistics.fmean(r.n_segments for r in scored), 2) if scored else None,
        "reward_per_step": rewards,
        "reward_first_last": [known[0], known[-1]] if known else None,
        "trained_tokens_per_step": [s.n_tokens for s in steps],
        "trained_tokens_per_s": [round(s.tokens_per_s or 0, 1) for s in steps],
        "t_train_s": round(sum(s.t_train_s or 0 for s in steps), 1),
        "t_rollout_s": round(sum(s.t_rollout_s or 0 for s in steps), 1),
        "tokens_ran_per_rollout": round(ran / max(len(in_batch), 1)),
        "tokens_ran_per_train_s": round(ran / max(sum(s.t_train_s or 0 for s in steps), 1e-9), 1),
        "trained_tokens": trained, "sampled_tokens": sampled, "trained_equals_sampled": trained == sampled,
    }


def _arm(tmp: Path, name: str, model: Path, steps: int, tasks: list[str], samples: int) -> dict[str, Any]:
    home = tmp / name
    (home / "models").mkdir(parents=True)
    shutil.copytree(model, home / "models" / "tiny")  # the same warmed-up model, built once
    config = home / "codex-compaction.toml"
    config.write_text(harness_config(ARMS[name]))
    env = {**os.environ, "FORGE_HOME": str(home)}
    t0 = time.perf_counter()
    out = subprocess.run(forge_argv(config, steps, tasks, samples), env=env, cwd=home, capture_output=True,
                         text=True, timeout=1800)
    wall = round(time.perf_counter() - t0, 1)
    if out.returncode != 0:
        raise RuntimeError(f"forge up ({name}) exited {out.returncode}: {(out.stdout + out.stderr)[-2000:]}")
    f = facts(home / "forge.db")
    f["wall_s"] = wall
    print(f"compaction {name}: wall {wall} s, {f['rollouts']} rollouts {f['rollout_status']}, compacted "
          f"{f['compacted_fraction']:.0%}, segments/rollout {f['segments_per_rollout']}, trained tokens "
          f"{f['trained_tokens']} = sampled {f['sampled_tokens']}: {f['trained_equals_sampled']}", flush=True)
    return f


def side_by_side(on: dict[str, Any], off: dict[str, Any]) -> list[dict[str, Any]]:
    """One row a step: reward, trained tokens and trained tokens/s of both arms."""
    rows = []
    for i in range(max(len(on["reward_per_step"]), len(off["reward_per_step"]))):
        def at(arm: dict[str, Any], key: str) -> Any:
            return arm[key][i] if i < len(arm[key]) else None
        rows.append({"step": i, "reward on": at(on, "reward_per_step"), "reward off": at(off, "reward_per_step"),
                     "trained tokens on": at(on, "trained_tokens_per_step"),
                     "trained tokens off": at(off, "trained_tokens_per_step"),
                     "trained tok/s on": at(on, "trained_tokens_per_s"),
                     "trained tok/s off": at(off, "trained_tokens_per_s")})
    return rows


def run(quick: bool = False) -> dict:
    from openforge.config import ForgeConfig
    from openforge.rollouts.harnesses import npm_harness
    from openforge.rollouts.harnesses.npm import find_package_bin
    from openforge.runs.prepare import resolve_model

    cache = Path(os.environ.get("FORGE_NPM_CACHE") or Path.home() / ".cache" / "openforge-npm").expanduser()
    if find_package_bin(cache, "codex", npm_harness("codex")) is None:
        raise RuntimeError(f"Codex is not installed in {cache}: forge harness install codex")
    os.environ["FORGE_NPM_CACHE"] = str(cache)
    steps, samples = (1, 2) if quick else (8, 16)
    with tempfile.TemporaryDirectory(prefix="forge-bench-compaction-") as tmp_name:
        tmp = Path(tmp_name)
        model = resolve_model(ForgeConfig(), tmp / "build")  # the demo's warmed-up tiny model
        arms = {name: _arm(tmp, name, model, steps, TASKS, samples) for name in ARMS}
    on, off = arms["on"], arms["off"]
    rows = side_by_side(on, off)
    for row in rows:
        print("  ".join(f"{k} {v}" for k, v in row.items()))

    def ratio(key: str) -> float | None:
        return round(on[key] / off[key], 2) if on[key] and off[key] else None

    tok_s = {name: round(sum(a["trained_tokens_per_step"]) / max(a["t_train_s"], 1e-9), 1) for name, a in arms.items()}
    return {"steps": steps, "tasks": TASKS, "samples_per_task": samples, "post_turn_percent": POST_TURN_PERCENT,
            "context_window": ARMS, "per_step": rows, "arms": arms,
            "trained_tokens_per_s": tok_s,
            "on_vs_off": {"trained_tokens": ratio("trained_tokens"), "t_train_s": ratio("t_train_s"),
                          "wall_s": ratio("wall_s"), "tokens_ran_per_rollout": ratio("tokens_ran_per_rollout"),
                          "tokens_ran_per_train_s": ratio("tokens_ran_per_train_s"),
                          "trained_tokens_per_s": round(tok_s["on"] / tok_s["off"], 2) if tok_s["off"] else None}}


if __name__ == "__main__":
    print(json.dumps(run("--quick" in sys.argv), indent=1, default=str))
