"""The trainer's parts of the GPU check, each in a fresh process (its own peak memory):

    python -m bench.gpu.training ours  '<json args>'   forge's GRPO step (trainer/grpo.py) on the engine's batch
    python -m bench.gpu.training trl   '<json args>'   TRL's GRPOTrainer, same model, prompts, group, lengths, loss
    torchrun --nproc_per_node 1 -m bench.gpu.training fsdp '<json args>'   forge's step under FSDP2 (trainer/distributed.py)

The loss is the demo's (openforge/presets/demo.toml): LoRA r 8 / alpha 16 on all linear layers, AdamW
lr 3e-3, clip 0.2, k3 KL to the adapter-disabled base with beta 0.2, token-mean, TIS cap 2; weights in
fp32 with bf16 autocast on a GPU, as `forge train` runs. One batch, several steps on it.

    tokens/s     sampled (loss) tokens / step time, median over the steps after the first. Ours: the
                 whole `grpo_step` (reference forward, forward, backward, optimizer). TRL: the step's
                 wall time less its generation (`_generate`); its reference forward stays in.
    peak memory  bench/trainer.py's PeakMeter: what training adds over the loaded model and optimizer
                 (CUDA: max allocated since then); `peak_gib` is the process's absolute peak.
    mismatch     ours, before the first update: |log pi_trainer - log mu_engine| on the sampled tokens
                 (engine bf16 weights vs trainer fp32 weights + bf16 autocast), and the importance weight
                 pi/mu the loss applies per token without TIS (raw) and with TIS (min(pi/mu, C)).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.trainer import ALPHA, PROMPTS, R, TARGETS, PeakMeter, _reward

DEMO_LOSS = {"lr": 3e-3, "kl_coef": 0.2, "clip_eps": 0.2, "tis_cap": 2.0, "loss_agg": "token-mean",
             "lora_r": R, "lora_alpha": ALPHA, "lora_target_modules": TARGETS}


def _config(steps: int) -> Any:
    from openforge.config import TrainerConfig

    return TrainerConfig(steps=steps, seed=0, **DEMO_LOSS)


def _samples(path: str) -> list:
    from openforge.trainer.data import Sample

    return [Sample(**row) for row in json.loads(Path(path).read_text())]


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_gib(device: Any) -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated(device) / 2**30, 3) if device.type == "cuda" else None


def importance_weights(model: Any, mbs: list, step_cfg: Any) -> dict:
    """Engine/trainer logprob gap on the sampled tokens before any update, and the per-token weight
    pi/mu of the loss without TIS (raw) and with it (capped at C: trainer/grpo.py policy_loss)."""
    import torch

    from openforge.trainer.grpo import token_logprobs
    from openforge.trainer.prefix import autocast

    gaps = []
    with torch.no_grad():
        for mb in mbs:
            with autocast(mb["input_ids"].device.type, step_cfg.autocast_dtype):
                logp = token_logprobs(model, mb["input_ids"], mb["attention_mask"], mb.get("temperature", 1.0),
                                      int(mb["first"]))
            gaps.append((logp.float() - mb["old_logp"].float())[mb["mask"] > 0])
    gap = torch.cat(gaps).double()
    raw = gap.exp()
    capped = raw.clamp(max=step_cfg.tis_cap)
    return {"tokens": gap.numel(), "mismatch_max": float(gap.abs().max()), "mismatch_mean": float(gap.abs().mean()),
            "without_tis": {"weight_max": float(raw.max()), "weight_min": float(raw.min()),
                            "mean_abs_weight_minus_1": float((raw - 1).abs().mean())},
            "with_tis": {"cap": step_cfg.tis_cap, "weight_max": float(capped.max()),
                         "mean_abs_weight_minus_1": float((capped - 1).abs().mean()),
                         "capped_share": float((raw > step_cfg.tis_cap).double().mean())}}


def _steps(step: Any, device: Any, steps: int) -> tuple[list[float], list[dict]]:
    times, metrics = [], []
    for _ in range(steps):
        _sync(device)
        t0 = time.perf_counter()
        metrics.append(step())
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times, metrics


def _summary(times: list[float], metrics: list[dict], meter: PeakMeter, device: Any) -> dict:
    later = times[1:] or times
    tokens = metrics[-1]["n_tokens"]
    return {"steps": len(times), "tokens_per_step": tokens, "step_s": round(statistics.median(later), 4),
            "tokens_per_s": round(tokens / statistics.median(later), 1), "peak_mib": round(meter.peak_mib(), 1),
            "peak_gib": _peak_gib(device), "peak_method": meter.method,
            "first_step": {k: metrics[0][k] for k in ("loss", "kl", "tis_frac", "mismatch_max", "mismatch_mean", "grad_norm")}}


def ours(args: dict) -> dict:
    """forge's GRPO step, one process: build_policy + build_optimizer + grpo_step on the engine's batch."""
    from openforge.trainer.data import micro_batches
    from openforge.trainer.grpo import StepConfig, grpo_step
    from openforge.trainer.model import autocast_dtype, build_optimizer, build_policy, pad_token_id, pick_device

    cfg = _config(args["steps"])
    device = pick_device("auto")
    step_cfg = StepConfig.from_trainer(cfg, autocast_dtype(device))
    model = build_policy(args["model_dir"], cfg, device=device)
    opt, sched = build_optimizer(model, cfg)
    mbs = micro_batches(_samples(args["samples"]), token_budget=cfg.micro_batch_tokens, pad_id=pad_token_id(model),
                        loss_agg=cfg.loss_agg, device=device, share_prefix_min=cfg.share_prefix_min_tokens)
    mismatch = importance_weights(model, mbs, step_cfg)
    meter = PeakMeter(device.type)
    meter.reset()
    times, metrics = _steps(lambda: grpo_step(model, opt, mbs, step_cfg, sched), device, args["steps"])
    model.save_pretrained(args["adapter_out"])  # the adapter the engine hot-loads next
    return {**_summary(times, metrics, meter, device), "micro_batches": len(mbs), "mismatch": mismatch}


def fsdp(args: dict) -> dict | None:
    """The same step under torchrun with FSDP2 (trainer/distributed.py: shard, distributed_step)."""
    from openforge.trainer import distributed
    from openforge.trainer.data import micro_batches
    from openforge.trainer.grpo import StepConfig
    from openforge.trainer.model import autocast_dtype, build_optimizer, build_policy, pad_token_id

    d = distributed.init()
    cfg = _config(args["steps"])
    step_cfg = StepConfig.from_trainer(cfg, autocast_dtype(d.device))
    model = build_policy(args["model_dir"], cfg, device=d.device)
    pad = pad_token_id(model)
    model = distributed.shard(model)
    opt, sched = build_optimizer(model, cfg)
    mbs = micro_batches(_samples(args["samples"]), token_budget=cfg.micro_batch_tokens, pad_id=pad,
                        loss_agg=cfg.loss_agg, device=d.device, share_prefix_min=0)  # FSDP: no shared prefixes
    meter = PeakMeter(d.device.type)
    meter.reset()
    times, metrics = _steps(lambda: distributed.distributed_step(model, opt, mbs, step_cfg, d, sched), d.device, args["steps"])
    out = {**_summary(times, metrics, meter, d.device), "world": d.world} if d.is_main else None
    distributed.leave()
    return out


def trl(args: dict) -> dict:
    """TRL's GRPOTrainer on the same checkpoint, prompts, group size, completion length and loss."""
    import torch
    from datasets import Dataset
    from datasets.table import InMemoryTable
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    steps, group, tasks, new = args["steps"], args["group"], args["tasks"], args["new_tokens"]

    class Timed(GRPOTrainer):
        gen_s, tokens = 0.0, 0

        def _generate(self, prompts: list) -> Any:
            t0 = time.perf_counter()
            out = super()._generate(prompts)
            _sync(device)
            self.gen_s += time.perf_counter() - t0
            return out

        def _prepare_inputs(self, inputs: Any) -> Any:
            batch = super()._prepare_inputs(inputs)
            self.tokens += int(batch["completion_mask"].sum())
            return batch

    rows: list[tuple[float, int]] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):  # noqa: ANN001
            meter.reset()

        def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001
            _sync(device)
            trainer.gen_s, trainer.tokens, self.t0 = 0.0, 0, time.perf_counter()

        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            _sync(device)
            rows.append((time.perf_counter() - self.t0 - trainer.gen_s, trainer.tokens))

    tok = AutoTokenizer.from_pretrained(args["model_dir"])
    # A fingerprint of our own: datasets would hash the Arrow table with dill, which failed on one
    # environment here (PicklingError on pyarrow's MonthDayNano) and is not what is measured.
    data = Dataset(InMemoryTable.from_pydict({"prompt": [[{"role": "user", "content": p}] for p in PROMPTS[:tasks]]}),
                   fingerprint="bench-gpu-prompts")
    config = GRPOConfig(
        output_dir=args["work"], max_steps=steps, learning_rate=DEMO_LOSS["lr"], beta=DEMO_LOSS["kl_coef"],
        epsilon=DEMO_LOSS["clip_eps"], loss_type="dapo", scale_rewards="group", num_iterations=1,
        per_device_train_batch_size=group * tasks, gradient_accumulation_steps=1, num_generations=group,
        max_completion_length=new, temperature=1.0, generation_kwargs={"min_new_tokens": new},
        lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0, report_to="none", logging_steps=1,
        save_strategy="no", disable_tqdm=True, use_cpu=device.type == "cpu", bf16=device.type == "cuda", fp16=False, seed=0,
        disable_dropout=True,
    )
    model = AutoModelForCausalLM.from_pretrained(args["model_dir"], dtype=torch.float32)
    trainer = Timed(model=model, reward_funcs=[lambda completion_ids, **kw: [_reward(c) for c in completion_ids]],
                    args=config, train_dataset=data, processing_class=tok, callbacks=[Clock()],
                    peft_config=LoraConfig(r=R, lora_alpha=ALPHA, target_modules=TARGETS, task_type="CAUSAL_LM"))
    meter = PeakMeter(device.type)
    trainer.train()
    later = rows[1:] or rows
    step_s = statistics.median(t for t, _ in later)
    tokens = statistics.median(n for _, n in later)
    return {"steps": len(rows), "tokens_per_step": tokens, "step_s": round(step_s, 4),
            "tokens_per_s": round(statistics.median(n / t for t, n in later), 1), "peak_mib": round(meter.peak_mib(), 1),
            "peak_gib": _peak_gib(device), "peak_method": meter.method,
            "gradient_checkpointing": bool(config.gradient_checkpointing)}


if __name__ == "__main__":
    kind, raw = sys.argv[1], sys.argv[2]
    args = json.loads(raw)
    result = {"ours": ours, "fsdp": fsdp, "trl": trl}[kind](args)
    if result is not None:
        Path(args["out"]).write_text(json.dumps(result, indent=1))
