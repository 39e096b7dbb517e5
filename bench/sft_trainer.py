"""SFT throughput and peak memory: `forge sft`'s trainer (trainer/sft.py) vs TRL's SFTTrainer.

Same random Qwen2 (built here: hidden 256, 4 layers; quick: the 64-wide tiny model), same data (chats
of a user turn of 40-600 tokens and an assistant answer of 8-64, the loss on the answer only: ours from
the rows' loss masks, TRL's from an `assistant_masks` column), same packing (rows of at most 2048 tokens,
positions restarting per sequence, no padding: TRL's `packing=True, packing_strategy="bfd"`, which is
padding-free), same hyper-parameters (LoRA r 8 / alpha 16 on all linear layers, AdamW lr 1e-4 constant,
one packed row per optimizer step, fp32, no activation checkpointing: TRL's SFTConfig turns it on by
default, forge sft has none).

    tokens/s      tokens of the packed rows per second of an optimizer step (forward, backward, clip,
                  step): ours = TrainStep.tokens_per_s's tokens over t_train_s; TRL = the batch's tokens
                  over the time from on_step_begin to on_step_end.
    peak memory   what the trainer adds at its peak over the moment before it loads the model (the same
                  model and LoRA in both, then the optimizer state and the steps' working set), each
                  trainer in a fresh process with the data made and the libraries both use (transformers,
                  peft) imported, so that neither counts an import; bench/trainer.py's PeakMeter
                  (CUDA max allocated, or CPU peak RSS via VmHWM). Also `at_first_step_end_mib`, what the
                  process holds when its first step ends, and `peak_over_first_step_mib`, the peak over
                  that moment: the measure this bench used until 2026-12-05, which on CPU counts the
                  memory a trainer's process happens to hold after its first step (freed tensors the
                  allocator kept, the trainer's own state) as free, and TRL's process holds more then:
                  it made forge sft look 1.62x TRL (this file's result at commit 2e4865f).

Medians over the steps after the first. Needs the `bench` extra (`pip install -e .[bench]`: trl).
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.trainer import ALPHA, LR, R, TARGETS, PeakMeter, _in_child, _status_kb

MAX_TOKENS, N_CHATS, EPOCHS = 2048, 48, 2
WORDS = ("file", "line", "test", "error", "count", "the", "sum", "folder", "script", "value", "print", "run")


def chats(tokenizer: Any, n: int, seed: int = 0) -> list[dict[str, list[int]]]:
    """`n` chats as token ids and an assistant mask (1 on the answer's tokens and its end token)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 600)))
        answer = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 64)))
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                               add_generation_prompt=True)
        p_ids = tokenizer.encode(prompt, add_special_tokens=False)
        a_ids = tokenizer.encode(answer + "<|im_end|>", add_special_tokens=False)
        out.append({"input_ids": p_ids + a_ids, "assistant_masks": [0] * len(p_ids) + [1] * len(a_ids)})
    return out


def ours(model_dir: str, data: list[dict], device: str, out: Any) -> None:
    from openforge.config import TrainerConfig
    from openforge.store import Store
    from openforge.trainer.sft import Example, train_sft

    home = Path(tempfile.mkdtemp(prefix="bench-sft-"))
    store = Store(home / "forge.db")
    run = store.create_run(kind="sft")
    examples = [Example(f"r{i}", f"t{i}", d["input_ids"], d["assistant_masks"]) for i, d in enumerate(data)]
    import peft  # noqa: F401 - imported before the meter starts, as trl() imports it (trainer/model.py: lazily)
    from transformers import AutoModelForCausalLM  # noqa: F401

    meter = PeakMeter(device)
    meter.reset()  # before train_sft loads the model
    first: list[float] = []

    def on_step(row: Any) -> None:
        if row.step == 1:
            first.append(_held_mib(meter))

    cfg = TrainerConfig(lr=LR, lora_r=R, lora_alpha=ALPHA, lora_target_modules=TARGETS, device=device)
    train_sft(store, home, run.id, model_path=Path(model_dir), examples=examples, cfg=cfg, epochs=EPOCHS,
              max_tokens=MAX_TOKENS, on_step=on_step)
    steps = store.list_train_steps(run.id)[1:]
    out.put({"steps": len(steps) + 1, **_memory(meter, first[0]),
             "tokens_per_s": statistics.median(s.n_tokens / s.t_train_s for s in steps),
             "tokens_per_row": statistics.median(s.n_tokens for s in steps)})


def trl(model_dir: str, data: list[dict], device: str, out: Any) -> None:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    meter = PeakMeter(device)
    meter.reset()  # before the model loads
    times: list[float] = []
    tokens: list[int] = []
    first: list[float] = []

    class Timed(SFTTrainer):
        def compute_loss(self, model, inputs, *args, **kwargs):  # noqa: ANN001, ANN201
            tokens.append(int(inputs["input_ids"].numel()))
            return super().compute_loss(model, inputs, *args, **kwargs)

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            times.append(time.perf_counter() - self.t0)
            if len(times) == 1:
                first.append(_held_mib(meter))

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    args = SFTConfig(output_dir=tempfile.mkdtemp(prefix="bench-trl-sft-"), num_train_epochs=EPOCHS,
                     per_device_train_batch_size=1, gradient_accumulation_steps=1, learning_rate=LR,
                     lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0, packing=True,
                     packing_strategy="bfd", max_length=MAX_TOKENS, logging_steps=1, save_strategy="no",
                     report_to=[], use_cpu=device == "cpu", bf16=False, dataloader_num_workers=0,
                     seed=0, disable_tqdm=True,
                     gradient_checkpointing=False)  # TRL's SFT default is True; forge sft keeps activations
    trainer = Timed(model=model, args=args, train_dataset=Dataset.from_list(data),
                    processing_class=AutoTokenizer.from_pretrained(model_dir), callbacks=[Clock()],
                    peft_config=LoraConfig(r=R, lora_alpha=ALPHA, target_modules=TARGETS, task_type="CAUSAL_LM"))
    trainer.train()
    steps = list(zip(tokens, times))[1:]
    out.put({"steps": len(times), **_memory(meter, first[0]),
             "tokens_per_s": statistics.median(n / t for n, t in steps),
             "tokens_per_row": statistics.median(n for n, _ in steps)})


def _held_mib(meter: PeakMeter) -> float:
    """What the process holds now over the meter's reset (CUDA allocated, or CPU RSS)."""
    import torch

    now = torch.cuda.memory_allocated() if meter.device == "cuda" else _status_kb("VmRSS") * 1024
    return (now - meter.base) / 2**20


def _memory(meter: PeakMeter, at_first_step_end: float) -> dict[str, Any]:
    peak = meter.peak_mib()
    method = ("CUDA max allocated - allocated" if meter.device == "cuda" else "peak RSS (VmHWM) - RSS") + \
        " before the model loads"
    return {"peak_mib": peak, "memory_method": method if "refused" not in meter.method else meter.method,
            "at_first_step_end_mib": at_first_step_end, "peak_over_first_step_mib": peak - at_first_step_end}


def run(quick: bool = False) -> dict:
    import importlib.util

    import torch

    if importlib.util.find_spec("trl") is None:
        raise RuntimeError("bench/sft_trainer.py compares against TRL: pip install -e '.[bench]' (trl>=1.16)")
    from transformers import AutoTokenizer

    from openforge.engine.tiny import build_tiny_model

    device = "cuda" if torch.cuda.is_available() else "cpu"
    size = {} if quick else {"hidden_size": 256, "layers": 4}
    model_dir = str(build_tiny_model(Path(tempfile.mkdtemp(prefix="bench-model-")) / "tiny", **size))
    data = chats(AutoTokenizer.from_pretrained(model_dir), N_CHATS // 2 if quick else N_CHATS)
    mine = _in_child(ours, model_dir, data, device)
    theirs = _in_child(trl, model_dir, data, device)
    result = {
        "device": device, "model": "tiny (64x2)" if quick else "qwen2 256x4", "chats": len(data),
        "tokens": sum(len(d["input_ids"]) for d in data), "max_tokens": MAX_TOKENS, "epochs": EPOCHS,
        "openforge": mine, "trl": theirs,
        "ratio_tokens_per_s": mine["tokens_per_s"] / theirs["tokens_per_s"],
        "ratio_peak_memory": mine["peak_mib"] / theirs["peak_mib"] if theirs["peak_mib"] else None,
    }
    print(f"SFT, {result['model']} on {device}, {len(data)} chats ({result['tokens']} tokens) packed in rows of "
          f"{MAX_TOKENS}, {EPOCHS} epochs")
    for name, r in (("openforge", mine), ("trl", theirs)):
        print(f"  {name:10} {r['tokens_per_s']:10.0f} tok/s   peak {r['peak_mib']:8.1f} MiB (at the first step's "
              f"end {r['at_first_step_end_mib']:.1f}, peak over that {r['peak_over_first_step_mib']:.1f})   "
              f"{r['steps']} steps, {r['tokens_per_row']:.0f} tokens a row")
    print(f"  ratio      {result['ratio_tokens_per_s']:10.2f}x throughput   "
          f"{result['ratio_peak_memory'] or float('nan'):.2f}x memory (lower is better)")
    return result


if __name__ == "__main__":
    run(quick=True)
