"""GRPO training-step throughput and peak memory: OpenForge's trainer vs TRL's GRPOTrainer.

Same run, same random Qwen2 (built here: hidden 256, 4 layers; quick: the 64-wide tiny model), same
prompts (chat template, 4 per step), same group size (G = 8), same completion length (16 tokens, EOS
ignored), same hyper-parameters (LoRA r 8 / alpha 16 on all linear layers, AdamW lr 1e-4, clip 0.2,
no KL, token-mean loss = TRL's `loss_type="dapo"`, std-normalised group advantages, one update per
batch). Sampling differs by design: OpenForge samples through the embedded engine in its own process
(as in production), TRL with `model.generate` inside the trainer; so only the *training* part of a
step is compared:

    tokens/s      sampled (loss) tokens per second of training compute: ours = TrainStep.tokens_per_s
                  (batch building, forward, backward, optimizer); TRL = the same tokens over the
                  step's wall time minus its `_prepare_inputs` (generation + scoring).
    peak memory   what training adds over the loaded model, the same way for both, each trainer in a
                  fresh process: the meter is reset when training begins (after imports, the model
                  load, the LoRA wrap and the optimizer; ours: the first `sample` call, TRL: its
                  `on_train_begin`); CUDA: max allocated over allocated then; CPU: the process's peak
                  RSS over its RSS then (the peak is reset there through /proc/self/clear_refs, so a
                  load-time spike does not count; where the kernel refuses, ru_maxrss is used and the
                  result says so). It includes the sampling phase of each step (ours: HTTP + store;
                  TRL: model.generate).
    mismatch      max |engine logprob - trainer logprob| on sampled tokens (fp32: must be ~0).

Medians over the steps after the first (warm-up). Needs the `bench` extra (`pip install -e .[bench]`).
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

PROMPTS = ["count the lines in data.txt", "write hello to a file", "run the tests", "list the folder",
           "fix the bug in the script", "print the version", "sort the numbers", "make a directory"]
G, NEW_TOKENS, TASKS_PER_STEP, LR, R, ALPHA = 8, 16, 4, 1e-4, 8, 16
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _reward(completion_ids: list[int]) -> float:
    return sum(1 for t in completion_ids if t % 4 == 0) / max(len(completion_ids), 1)


class PeakMeter:
    """What a trainer's process adds at its peak over the moment training begins (see the module
    docstring). CUDA: max allocated since `reset`; CPU: peak RSS since `reset` (VmHWM, reset through
    /proc/self/clear_refs) over RSS at `reset`; if the kernel refuses the reset, the whole process's
    peak (ru_maxrss), which then also holds the model load's, and `method` says so."""

    def __init__(self, device: str) -> None:
        self.device, self.base, self.method = device, 0, ""

    def reset(self) -> None:
        import torch

        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            self.base, self.method = torch.cuda.memory_allocated(), "cuda max_memory_allocated - allocated at train begin"
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # 5: reset the peak RSS (VmHWM) to the current RSS
            self.method = "peak RSS (VmHWM, reset at train begin) - RSS at train begin"
        except OSError:
            self.method = "peak RSS of the process (ru_maxrss; VmHWM reset refused) - RSS at train begin"
        self.base = _status_kb("VmRSS") * 1024

    def peak_mib(self) -> float:
        import resource

        import torch

        if self.device == "cuda":
            return (torch.cuda.max_memory_allocated() - self.base) / 2**20
        peak_kb = _status_kb("VmHWM") if "VmHWM" in self.method else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return max(peak_kb * 1024 - self.base, 0) / 2**20


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


class _MeteredSampler:
    """`sampler` that resets `meter` on its first call: the moment our trainer begins training."""

    def __init__(self, sampler: Any, meter: PeakMeter) -> None:
        self.sampler, self.meter, self.started = sampler, meter, False

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        if not self.started:
            self.started = True
            self.meter.reset()
        return self.sampler.sample(*args, **kwargs)


def ours(model_dir: str, engine_url: str, steps: int, device: str, out: Any) -> None:
    """OpenForge: EngineSampler -> trainer.loop.train, adapters hot-loaded into the engine each step."""
    from transformers import AutoTokenizer

    from openforge.config import TrainerConfig
    from openforge.store import Store
    from openforge.trainer.loop import train
    from openforge.trainer.adapter_sync import AdapterSync
    from openforge.trainer.bridge import BackgroundLoop
    from openforge.trainer.samplers import EngineSampler

    tok = AutoTokenizer.from_pretrained(model_dir)
    tasks = [{"id": f"p{i}", "prompt_ids": list(tok.apply_chat_template(
        [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True, return_dict=False))}
        for i, p in enumerate(PROMPTS)]
    home = Path(tempfile.mkdtemp(prefix="bench-trainer-"))
    store = Store(home / "forge.db")
    run = store.create_run(name="bench")
    cfg = TrainerConfig(steps=steps, tasks_per_step=TASKS_PER_STEP, lr=LR, lora_r=R, lora_alpha=ALPHA,
                        lora_target_modules=TARGETS, micro_batch_tokens=1 << 20, device=device, seed=0)
    bridge = BackgroundLoop()
    client = bridge.run(_client(engine_url))
    sampler = EngineSampler(client, store, bridge, reward_fn=lambda _t, c: _reward(c), group_size=G,
                            max_new_tokens=NEW_TOKENS, ignore_eos=True)
    meter = PeakMeter(device)
    res = train(store, run.id, cfg, model_path=model_dir, tasks=tasks, sampler=_MeteredSampler(sampler, meter),
                engine=AdapterSync(client, bridge), home=home)
    bridge.run(client.aclose())
    bridge.close()
    later = res.steps[1:] or res.steps
    out.put({"tokens_per_s": statistics.median(m["tokens_per_s"] for m in later),
             "tokens_per_step": statistics.median(m["n_tokens"] for m in later),
             "peak_mib": meter.peak_mib(), "peak_method": meter.method,
             "mismatch_max": max(m["mismatch_max"] for m in res.steps),
             "mismatch_mean": statistics.fmean(m["mismatch_mean"] for m in res.steps)})


async def _client(url: str):  # created on the bridge's loop, which owns its connection pool
    from openforge.engine.client import EngineClient

    return EngineClient(url, timeout=120)


def trl(model_dir: str, steps: int, device: str, out: Any) -> None:
    """TRL's GRPOTrainer, timed per step with its generation (`_prepare_inputs`) taken out."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class Timed(GRPOTrainer):
        gen_s, tokens = 0.0, 0

        def _prepare_inputs(self, inputs: Any) -> Any:
            t0 = time.perf_counter()
            batch = super()._prepare_inputs(inputs)
            self.gen_s += time.perf_counter() - t0
            self.tokens += int(batch["completion_mask"].sum())
            return batch

    rows: list[tuple[float, int]] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):  # noqa: ANN001
            meter.reset()

        def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001
            trainer.gen_s, trainer.tokens, self.t0 = 0.0, 0, time.perf_counter()

        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            rows.append((time.perf_counter() - self.t0 - trainer.gen_s, trainer.tokens))

    tok = AutoTokenizer.from_pretrained(model_dir)
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in PROMPTS]})
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"), max_steps=steps, learning_rate=LR,
        per_device_train_batch_size=G * TASKS_PER_STEP, gradient_accumulation_steps=1, num_generations=G,
        max_completion_length=NEW_TOKENS, temperature=1.0, beta=0.0, epsilon=0.2, num_iterations=1,
        loss_type="dapo", scale_rewards="group", lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0,
        generation_kwargs={"min_new_tokens": NEW_TOKENS}, report_to="none", logging_steps=1, save_strategy="no",
        use_cpu=device == "cpu", bf16=False, fp16=False, seed=0, disable_dropout=True,
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    trainer = Timed(model=model, reward_funcs=[lambda completion_ids, **kw: [_reward(c) for c in completion_ids]],
                    args=args, train_dataset=data, processing_class=tok, callbacks=[Clock()],
                    peft_config=LoraConfig(r=R, lora_alpha=ALPHA, target_modules=TARGETS, task_type="CAUSAL_LM"))
    meter = PeakMeter(device)
    trainer.train()
    later = rows[1:] or rows
    out.put({"tokens_per_s": statistics.median(n / t for t, n in later),
             "tokens_per_step": statistics.median(n for _, n in later), "peak_mib": meter.peak_mib(),
             "peak_method": meter.method})


def _in_child(target: Any, *args: Any) -> dict:
    """Run one trainer in a fresh process (its own peak memory), and return what it measured."""
    import queue as q

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, results))
    proc.start()
    try:
        while True:
            try:
                return results.get(timeout=1.0)
            except q.Empty:
                if not proc.is_alive():
                    raise RuntimeError(f"the {target.__name__} benchmark process died (exit {proc.exitcode})") from None
    finally:
        proc.join(timeout=60)


def run(quick: bool = False) -> dict:
    import importlib.util

    import torch

    if importlib.util.find_spec("trl") is None:
        raise RuntimeError("bench/trainer.py compares against TRL: pip install -e '.[bench]' (trl>=1.16)")

    from openforge.engine.supervisor import EngineProcess
    from openforge.engine.tiny import build_tiny_model
    from openforge.config import EmbeddedEngineConfig

    device = "cuda" if torch.cuda.is_available() else "cpu"
    steps = 3 if quick else 6
    size = {} if quick else {"hidden_size": 256, "layers": 4}
    model_dir = str(build_tiny_model(Path(tempfile.mkdtemp(prefix="bench-model-")) / "tiny", **size))
    engine = EngineProcess(EmbeddedEngineConfig(model=model_dir, dtype="float32", device=device,
                                                max_batch_size=G * TASKS_PER_STEP))
    engine.start()
    try:
        mine = _in_child(ours, model_dir, engine.url, steps, device)
    finally:
        engine.stop()
    theirs = _in_child(trl, model_dir, steps, device)
    result = {
        "device": device, "model": "tiny (64x2)" if quick else "qwen2 256x4", "steps": steps,
        "openforge": mine, "trl": theirs,
        "ratio_tokens_per_s": mine["tokens_per_s"] / theirs["tokens_per_s"],
        "ratio_peak_memory": mine["peak_mib"] / theirs["peak_mib"] if theirs["peak_mib"] else None,
    }
    print(f"GRPO train step, {result['model']} on {device}, {steps} steps, {TASKS_PER_STEP}x{G} rollouts x {NEW_TOKENS} tokens")
    print(f"  openforge  {mine['tokens_per_s']:10.0f} tok/s   peak {mine['peak_mib']:8.1f} MiB")
    print(f"  trl        {theirs['tokens_per_s']:10.0f} tok/s   peak {theirs['peak_mib']:8.1f} MiB")
    print(f"  ratio      {result['ratio_tokens_per_s']:10.2f}x throughput   "
          f"{result['ratio_peak_memory'] or float('nan'):.2f}x memory (lower is better)")
    print(f"  engine/trainer logprob mismatch on the embedded engine: max {mine['mismatch_max']:.2e}, "
          f"mean {mine['mismatch_mean']:.2e}")
    return result


if __name__ == "__main__":
    run(quick=True)
