"""Shared-prefix training: one GRPO step on a group of 8 rollouts that share a long prompt (a harness's
system prompt + tools + task, ~50k tokens as Claude Code's first request), with sharing on vs off.

    model      the tiny Qwen2 (64 wide, 2 layers) with 65,536 positions, LoRA r 8 on every linear layer
    rollouts   8, each: the shared prompt, then 128 sampled tokens, a 64-token tool result, 128 more
    off        every row runs in full (50k+ tokens each, one micro-batch per row: the budget is 4,096)
    on         trainer/prefix.py: the prompt runs once, the 8 suffixes attend to its K/V, one prefix backward

Each mode runs in its own process: wall time of `grpo_step` (forward, backward, optimizer), peak RSS
growth over the step (VmHWM over RSS before it), the process's CPU time (less sensitive than wall
time to other jobs on a shared machine), and the LoRA gradient, so the two gradients are
compared too (max |diff| / max |g|). `--quick`: an 8k-token prompt.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.trainer import PeakMeter, _in_child

G, TURN, TOOL, BUDGET = 8, 128, 64, 4096


def _samples(prefix_len: int) -> list[Any]:
    from openforge.trainer.data import Sample

    rng = random.Random(0)
    prompt = [rng.randrange(3, 900) for _ in range(prefix_len)]
    out = []
    for k in range(G):
        c1, tool, c2 = ([rng.randrange(3, 900) for _ in range(n)] for n in (TURN, TOOL, TURN))
        ids = prompt + c1 + tool + c2
        mask = [0] * prefix_len + [1] * TURN + [0] * TOOL + [1] * TURN
        logp = [-6.9 if m else 0.0 for m in mask]
        out.append(Sample(f"r{k}", "task", 0, ids, mask, logp, 1.0 if k % 2 else -1.0, float(k % 2)))
    return out


def one_step(model_dir: str, prefix_len: int, share: bool, out: Any) -> None:
    import torch

    from openforge.config import TrainerConfig
    from openforge.trainer.data import micro_batches
    from openforge.trainer.grpo import StepConfig, grpo_step
    from openforge.trainer.model import build_optimizer, build_policy

    torch.manual_seed(0)
    cfg = TrainerConfig(lora_r=8, lora_alpha=16, lr=1e-4, micro_batch_tokens=BUDGET)
    model = build_policy(model_dir, cfg, device=torch.device("cpu"))
    opt, _ = build_optimizer(model, cfg)
    samples = _samples(prefix_len)
    meter = PeakMeter("cpu")
    meter.reset()
    t0, c0 = time.perf_counter(), time.process_time()
    mbs = micro_batches(samples, token_budget=BUDGET, pad_id=0, loss_agg="token-mean",
                        share_prefix_min=256 if share else 0)
    metrics = grpo_step(model, opt, mbs, StepConfig(max_grad_norm=1e9))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    prefixes = {int(mb["prefix_id"]): int(mb["prefix_ids"].numel()) for mb in mbs if "prefix_id" in mb}
    out.put({"wall_s": wall, "cpu_s": cpu, "peak_mib": meter.peak_mib(), "micro_batches": len(mbs),
             "tokens_forwarded": sum(int(mb["input_ids"].numel()) for mb in mbs) + sum(prefixes.values()),
             "n_tokens": metrics["n_tokens"], "grad": grad.tolist()})


def _long_context_model(context: int) -> str:
    """The tiny model with `context` positions (its RoPE needs no other change)."""
    from openforge.engine.tiny import build_tiny_model

    path = build_tiny_model(Path(tempfile.mkdtemp(prefix="bench-prefix-")) / "tiny")
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = context
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def run(quick: bool = False) -> dict:
    import torch

    prefix_len = 8_000 if quick else 50_000
    model_dir = _long_context_model(65_536)
    on = _in_child(one_step, model_dir, prefix_len, True)
    off = _in_child(one_step, model_dir, prefix_len, False)
    g_on, g_off = torch.tensor(on.pop("grad")), torch.tensor(off.pop("grad"))
    result = {
        "prefix_tokens": prefix_len, "rollouts": G, "suffix_tokens": 2 * TURN + TOOL, "threads": torch.get_num_threads(),
        "on": on, "off": off, "speedup": off["wall_s"] / on["wall_s"], "cpu_ratio": off["cpu_s"] / on["cpu_s"],
        "ratio_peak_memory": on["peak_mib"] / off["peak_mib"] if off["peak_mib"] else None,
        "grad_rel_error": float((g_on - g_off).abs().max() / g_off.abs().max()),
    }
    print(f"GRPO step, {G} rollouts sharing a {prefix_len}-token prompt (+{2 * TURN + TOOL} tokens each), tiny "
          f"Qwen2 + LoRA, CPU x{result['threads']} threads")
    for name in ("off", "on"):
        r = result[name]
        print(f"  sharing {name:3s}: {r['wall_s']:7.1f} s wall, {r['cpu_s']:7.1f} s CPU  peak +{r['peak_mib']:7.0f} MiB  {r['micro_batches']} micro-batches")
    print(f"  speedup {result['speedup']:.1f}x wall, {result['cpu_ratio']:.1f}x CPU time, memory {result['ratio_peak_memory']:.2f}x, "
          f"gradient max|diff|/max|g| {result['grad_rel_error']:.1e}")
    return result


if __name__ == "__main__":
    import sys

    run(quick="--quick" in sys.argv)
