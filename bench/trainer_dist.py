"""Trainer throughput under torchrun: tokens/s of one GRPO step at 1 process vs 2 FSDP2 ranks (gloo).

Same model (random Qwen2, hidden 256, 4 layers; quick: the 64-wide tiny one), same batches (16
samples of 64 prompt + 64 sampled tokens a step, LoRA r 8 on all linear layers, token budget 1024 a
micro-batch), same code path as `forge train` (trainer/distributed.py's step under torchrun).

    tokens/s   sampled (loss) tokens per second of the step (forward, backward, collectives, optimizer),
               median over the steps after the first.

Three ways, each in its own process: one process with torch's default threads (the baseline), one
process with 1 thread, and torchrun with 2 ranks of 1 thread each. On a 2-core machine the 2 ranks get
no more cores than the baseline: this shows the overhead of sharding more than any speed-up, which
needs a core (or a GPU) per rank.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
N_SAMPLES, PROMPT, COMPLETION, BUDGET = 16, 64, 64, 1024


def _samples(step: int) -> list:
    import random

    from openforge.trainer.data import Sample

    rng = random.Random(step)
    out = []
    for i in range(N_SAMPLES):
        ids = [rng.randrange(3, 200) for _ in range(PROMPT + COMPLETION)]
        out.append(Sample(rollout_id=f"r{i}", task_id=f"t{i // 8}", segment=0, token_ids=ids,
                          loss_mask=[0] * PROMPT + [1] * COMPLETION, logprobs=[0.0] * PROMPT + [-6.9] * COMPLETION,
                          advantage=1.0 if i % 2 else -1.0, reward=float(i % 2)))
    return out


def worker(model_dir: str, steps: int, out: str) -> None:
    """One process (no torchrun) or one rank of a torchrun job: time `steps` steps."""
    import torch

    from openforge.config import TrainerConfig
    from openforge.trainer import distributed
    from openforge.trainer.data import micro_batches
    from openforge.trainer.grpo import StepConfig, grpo_step
    from openforge.trainer.model import build_optimizer, build_policy

    cfg = TrainerConfig(lora_r=8, lora_alpha=16, lr=1e-4, seed=0, micro_batch_tokens=BUDGET)
    step_cfg = StepConfig()
    d = distributed.init() if distributed.launched() else None
    torch.manual_seed(0)
    model = build_policy(model_dir, cfg, device=torch.device("cpu"))
    if d is not None:
        model = distributed.shard(model)
    opt, sched = build_optimizer(model, cfg)
    times, tokens = [], 0
    for step in range(steps):
        mbs = micro_batches(_samples(step), token_budget=BUDGET, pad_id=0, loss_agg="token-mean")
        t0 = time.perf_counter()
        m = distributed.distributed_step(model, opt, mbs, step_cfg, d, sched) if d else grpo_step(model, opt, mbs, step_cfg, sched)
        times.append(time.perf_counter() - t0)
        tokens = m["n_tokens"]
    if d is None or d.is_main:
        Path(out).write_text(json.dumps({"times": times, "tokens": tokens, "threads": torch.get_num_threads()}))
    if d is not None:
        distributed.leave()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _measure(prefix: list[str], model_dir: str, steps: int, env: dict[str, str]) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([*prefix, "-m", "bench.trainer_dist", "--worker", model_dir, str(steps), f.name],
                       env={**os.environ, "PYTHONPATH": str(ROOT), **env}, cwd=ROOT, check=True, timeout=900,
                       stdout=subprocess.DEVNULL)
        got = json.loads(Path(f.name).read_text())
    step_s = statistics.median(got["times"][1:])
    return {"tokens_per_s": round(got["tokens"] / step_s, 1), "step_s": round(step_s, 3), "threads": got["threads"]}


def run(quick: bool = False) -> dict:
    from openforge.engine.tiny import build_tiny_model

    steps = 3 if quick else 6
    size = {} if quick else {"hidden_size": 256, "layers": 4}
    model_dir = str(build_tiny_model(Path(tempfile.mkdtemp(prefix="bench-model-")) / "tiny", **size))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                "--master_port", str(_free_port())]
    one = _measure([sys.executable], model_dir, steps, {})
    one_thread = _measure([sys.executable], model_dir, steps, {"OMP_NUM_THREADS": "1"})
    two = _measure(torchrun, model_dir, steps, {"OMP_NUM_THREADS": "1"})
    res = {"one_process": one, "one_process_1_thread": one_thread, "two_ranks_fsdp": two,
           "ratio_two_ranks_vs_one_process": round(two["tokens_per_s"] / one["tokens_per_s"], 2),
           "ratio_two_ranks_vs_one_thread": round(two["tokens_per_s"] / one_thread["tokens_per_s"], 2),
           "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 1)}
    print(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        run(quick="--quick" in sys.argv)
