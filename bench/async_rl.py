"""Asynchronous RL (`trainer.max_staleness`): trained tokens per wall-clock minute and trainer busy fraction, synchronous vs one-step overlap vs asynchronous at staleness 1, 2 and 4, in one run; and a training-bound variant (long sequences, short rollouts) for the trainer's idle fraction at sync, overlap, K = 1 and 2.

The real loop (`trainer.loop.train`: the tiny Qwen2 with LoRA on CPU, real GRPO updates, checkpoints,
the store) over a scripted sampler: each rollout "runs" for a duration drawn from a log-normal
(median `MEDIAN_S`, sigma `SIGMA` = 1.0: p99/p50 = 10x; no per-rollout durations of real Claude Code /
Codex rollouts are recorded in the tests' or benches' stores, so the shape is declared here, not
replayed) and then writes replayed trajectories, so every mode sees the same duration for the same
(task, step, sample). A group ends with its slowest rollout; a synchronous step with its slowest
group. Rollouts wait, they do not compute (a harness's CPU is elsewhere on a cluster), so the 2 cores
are the trainer's.

    busy fraction   (train + save/hot-load time of all steps) / the run's wall time
    tokens/min      trained (sampled, loss) tokens / wall minutes
    idle fraction   the loop's wait for batches (t_rollout_s) / (wait + train + save/hot-load), per step
                    summed; `_after_first` leaves out step 0, whose wait for its whole batch (the
                    pipeline fill) every mode has

Each mode runs `repeats` times, the modes interleaved; the median run (by tokens/min) is kept.
Asynchronous modes keep up to (K + 1) x tasks_per_step groups in flight where a synchronous step
has tasks_per_step: part of their gain is that concurrency, which a real engine must have room for.

The first section (`modes`) is sampling-bound: 48-token rollouts train in ~0.05 s a step, far less
than a 0.3 s-median rollout takes, so the trainer's idle fraction is set by how fast rollouts arrive.
The second (`training_bound`) makes training the bottleneck by construction, not by scaling rollouts
to a measured step time (which moves several-fold with the shared machine's load): 1024-token
rollouts (a step of ~0.6 s on a quiet machine; load lengthens it, which widens the asynchronous
modes' margin and lowers sync's idle fraction) whose durations keep the same log-normal tail at a
0.05 s median. Asynchronous groups then finish
while a step trains, so the trainer's idle time there is the schedule's; a synchronous step still
waits for its slowest of 16 rollouts. Its figures are each the median over the repeats, its
tokens/min ratios the median of each repeat's own ratio (a training-bound rate follows the step time,
which the load moves from one minute to the next).
"""

from __future__ import annotations

import math
import os
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MEDIAN_S, SIGMA = 0.3, 1.0
G, TASKS_PER_STEP, PROMPT, COMPLETION = 4, 4, 16, 32
MODES: dict[str, dict[str, Any]] = {"sync": {}, "overlap": {"overlap": True}, "async_k1": {"max_staleness": 1},
                                    "async_k2": {"max_staleness": 2}, "async_k4": {"max_staleness": 4}}


@dataclass(frozen=True)
class Shape:
    """One variant's rollouts: their durations (log-normal) and tokens (prompt + completion each)."""

    median_s: float
    sigma: float
    prompt: int
    completion: int


SAMPLING_BOUND = Shape(MEDIAN_S, SIGMA, PROMPT, COMPLETION)
# Training-bound by construction: 1024 tokens a rollout make a step of ~0.6 s on a quiet machine (longer
# under load), while the rollouts keep the same heavy tail at a 0.05 s median, so a step's slowest of
# 16 (~0.3 s typical) still holds up a synchronous step.
TRAINING_BOUND = Shape(0.05, SIGMA, 64, 960)
TRAINING_BOUND_MODES, BOUND_STEPS = ["sync", "overlap", "async_k1", "async_k2"], 8


def duration(task_id: str, step: int, k: int, shape: Shape = SAMPLING_BOUND) -> float:
    """The scripted wall time of one rollout: log-normal, the same in every mode."""
    rng = random.Random(f"{task_id}-{step}-{k}")
    return shape.median_s * math.exp(shape.sigma * rng.gauss(0.0, 1.0))


class SimSampler:
    """G rollouts per task, run in parallel for their scripted durations, then recorded as the proxy would."""

    def __init__(self, store: Any, shape: Shape = SAMPLING_BOUND) -> None:
        self.store, self.shape = store, shape

    def sample(self, run_id: str, tasks: list, *, step: int, adapter: str | None) -> list:
        from openforge.store import Trajectory

        prompt, completion = self.shape.prompt, self.shape.completion
        time.sleep(max(duration(t["id"], step, k, self.shape) for t in tasks for k in range(G)))
        out = []
        for task in tasks:
            for k in range(G):
                rng = random.Random(f"{task['id']}-{step}-{k}-tokens")
                r = self.store.create_rollout(run_id=run_id, task_id=task["id"], step=step, sample_index=k,
                                              adapter=adapter, status="running")
                ids = [rng.randrange(3, 900) for _ in range(prompt + completion)]
                self.store.replace_trajectories(r.id, [Trajectory(
                    run_id=run_id, rollout_id=r.id, segment=0, token_ids=ids, loss_mask=[0] * prompt + [1] * completion,
                    logprobs=[0.0] * prompt + [-6.8] * completion, n_tokens=len(ids))])
                out.append(self.store.update_rollout(r.id, status="scored", reward=float(rng.random() < 0.4)))
        return out


def _mode(model: Path, steps: int, extra: dict[str, Any], shape: Shape = SAMPLING_BOUND) -> dict[str, Any]:
    from openforge.config import TrainerConfig
    from openforge.store import Store
    from openforge.trainer.loop import train

    with tempfile.TemporaryDirectory() as home:
        store = Store(Path(home) / "forge.db")
        run = store.create_run()
        cfg = TrainerConfig(steps=steps, tasks_per_step=TASKS_PER_STEP, lr=1e-3, lora_r=8, lora_alpha=16,
                            micro_batch_tokens=4096, seed=0, device="cpu", **extra)
        tasks = [{"id": f"task-{i}"} for i in range(12)]
        t0 = time.perf_counter()
        res = train(store, run.id, cfg, model_path=model, tasks=tasks, sampler=SimSampler(store, shape),
                    home=Path(home))
        wall = time.perf_counter() - t0
        store.close()
    busy = sum(s["t_train_s"] + s["t_sync_s"] for s in res.steps)
    tokens = sum(s["n_tokens"] for s in res.steps)
    stale: dict[int, int] = {}
    lag = 1 if extra.get("overlap") else 0  # overlap: step N+1 sampled by step N-1's adapter (step 0: none)
    for s in res.steps:
        for k, n in s.get("staleness", {min(lag, s["step"]): s["n_groups"]}).items():
            stale[int(k)] = stale.get(int(k), 0) + int(n)
    return {"wall_s": round(wall, 2), "busy_fraction": round(busy / wall, 3),
            "tokens_per_min": round(tokens / wall * 60), "train_s_per_step": round(statistics.median(
                s["t_train_s"] + s["t_sync_s"] for s in res.steps), 3),
            "staleness": {str(k): v for k, v in sorted(stale.items())},
            "stale_waits": sum(int(s.get("stale_waits", 0)) for s in res.steps),
            "idle_fraction": idle_fraction(res.steps), "idle_fraction_after_first": idle_fraction(res.steps[1:])}


def idle_fraction(steps: list[dict[str, Any]]) -> float:
    """The share of the training loop's time spent waiting for a batch: t_rollout_s (phase 1, the wait
    for sampled groups) over t_rollout_s + t_train_s + t_sync_s, summed over `steps`.

    The first step always waits for its whole batch (nothing is sampled before the loop starts, in any
    mode); `steps[1:]` leaves that pipeline fill out."""
    wait = sum(s["t_rollout_s"] for s in steps)
    loop = wait + sum(s["t_train_s"] + s["t_sync_s"] for s in steps)
    return round(wait / loop, 4) if loop > 0 else 0.0


def _median_figures(runs: list[dict[str, Any]], sync_runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each scalar figure's median over the repeats (a run's idle fraction and its tokens/min need not
    come from the same repeat), every repeat's idle fraction after the first step (the spread), and the
    tokens/min ratio to sync as the median of each repeat's ratio: a training-bound run's rate follows
    the step time, which the machine's load moves, and a repeat's runs are minutes-close in time."""
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float))]
    out: dict[str, Any] = {k: round(statistics.median(r[k] for r in runs), 4) for k in keys}
    out["tokens_per_min"] = round(out["tokens_per_min"])
    out["idle_fraction_after_first_runs"] = [r["idle_fraction_after_first"] for r in runs]
    out["tokens_per_min_vs_sync"] = round(statistics.median(
        r["tokens_per_min"] / s["tokens_per_min"] for r, s in zip(runs, sync_runs)), 2)
    return out


def run(quick: bool = False) -> dict:
    from openforge.engine.tiny import build_tiny_model

    steps, repeats = (6, 1) if quick else (8, 3)
    bound_steps = 4 if quick else BOUND_STEPS
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in MODES}
    bound_runs: dict[str, list[dict[str, Any]]] = {name: [] for name in TRAINING_BOUND_MODES}
    loads: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "tiny")
        _mode(model, 2, {})  # warm-up: imports, first-step allocations
        _mode(model, 1, {}, TRAINING_BOUND)  # and the long sequences' first allocations
        for _ in range(repeats):  # modes interleaved, so a burst of other jobs' load hits them alike
            loads.append(round(os.getloadavg()[0], 1))  # other jobs' load moves the step time: shown per repeat
            for name, extra in MODES.items():
                runs[name].append(_mode(model, steps, extra))
            for name in TRAINING_BOUND_MODES:
                bound_runs[name].append(_mode(model, bound_steps, MODES[name], TRAINING_BOUND))
    # each mode's median run by tokens/min (the machine is shared: single runs vary)
    modes = {name: sorted(rs, key=lambda f: f["tokens_per_min"])[len(rs) // 2] for name, rs in runs.items()}
    base = modes["sync"]["tokens_per_min"]
    for figures in modes.values():
        figures["tokens_per_min_vs_sync"] = round(figures["tokens_per_min"] / base, 2)
    bound = {name: _median_figures(rs, bound_runs["sync"]) for name, rs in bound_runs.items()}
    for name, f in modes.items():
        print(f"async_rl {name}: {f['tokens_per_min']} tokens/min ({f['tokens_per_min_vs_sync']}x sync), "
              f"trainer busy {f['busy_fraction']:.0%}, staleness {f['staleness']}, wall {f['wall_s']} s")
    for name, f in bound.items():
        print(f"async_rl training-bound {name}: trainer idle {f['idle_fraction_after_first']:.0%} after the first step "
              f"({f['idle_fraction']:.0%} with it; runs {f['idle_fraction_after_first_runs']}), "
              f"{f['tokens_per_min']} tokens/min ({f['tokens_per_min_vs_sync']}x sync), step {f['train_s_per_step']} s")
    return {"steps": steps, "repeats": repeats, "group_size": G, "tasks_per_step": TASKS_PER_STEP,
            "median_rollout_s": MEDIAN_S, "sigma": SIGMA, "load_avg_1m_per_repeat": loads, "modes": modes,
            "training_bound": {"steps": bound_steps, "median_rollout_s": TRAINING_BOUND.median_s,
                               "sigma": TRAINING_BOUND.sigma,
                               "tokens_per_rollout": TRAINING_BOUND.prompt + TRAINING_BOUND.completion,
                               "modes": bound}}


if __name__ == "__main__":
    run(quick=True)
