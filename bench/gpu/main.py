"""`bench/gpu/run.sh` runs this: every part of the GPU check in one run, one JSON and one markdown table.

    python -m bench.gpu.main --out DIR [--dry-run] [--work DIR]

Parts, in order (each records its wall time, its peak GPU memory and its error, and a failing part
does not stop the others): the machine; Qwen3-1.7B-shaped: engine decode vs model.generate, the
prefix cache, a GRPO batch sampled by the engine, forge's GRPO step (+ the engine/trainer mismatch),
LoRA hot-load into the engine, TRL's GRPOTrainer, forge's step under torchrun/FSDP2; Qwen2.5-7B-shaped:
engine decode vs model.generate. `--dry-run`: the same parts on the CPU at toy size (CI runs it).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.gpu import models, report

ROOT = Path(__file__).resolve().parents[2]
TRAIN_MODEL = "qwen3-1.7b"


@dataclass(frozen=True)
class Plan:
    decode_models: tuple[str, ...] = (TRAIN_MODEL, "qwen2.5-7b")
    batches: tuple[int, ...] = (1, 8, 32)
    new_tokens: int = 64
    repeats: int = 2
    group_tokens: int | None = None  # the prefix-cache group's prompt: None = the whole recorded request
    tasks: int = 4  # GRPO batch: tasks x group rollouts x train_new_tokens sampled tokens
    group: int = 8
    train_new_tokens: int = 128
    steps: int = 4
    budget_s: float = 330.0  # parts not started by then are skipped (the device call's limit: 480 s)
    child_timeout_s: float = 120.0


def dry_plan() -> Plan:
    from openforge.engine.scheduler import PREFILL_CHUNK

    # Past one prefill chunk, so the group's prompt is prefilled chunk by chunk as on the GPU.
    return Plan(new_tokens=8, repeats=1, group_tokens=PREFILL_CHUNK + 256, tasks=2, group=4, train_new_tokens=8,
                steps=2, budget_s=600.0, child_timeout_s=300.0)


class Run:
    """The parts' results, with each part's wall time, peak GPU memory and status."""

    def __init__(self, plan: Plan, device: str) -> None:
        self.plan, self.device, self.start = plan, device, time.monotonic()
        self.results: dict[str, Any] = {}
        self.parts: list[dict] = []

    def measure(self, name: str, fn: Callable[[], dict]) -> dict | None:
        """Run part `name` (`fn` returns its figures; "_status" in them replaces "ok") unless the
        budget is spent; a failure is recorded, printed and returns None, and the run goes on."""
        import torch

        row: dict[str, Any] = {"part": name}
        self.parts.append(row)
        if time.monotonic() - self.start > self.plan.budget_s:
            row["status"] = f"skipped: past the {self.plan.budget_s:.0f} s budget"
            print(f"== {name}: {row['status']}", flush=True)
            return None
        print(f"== {name}", flush=True)
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.monotonic()
        out = None
        try:
            out = fn()
            row["status"] = out.pop("_status", "ok")
            self.results[name] = out
        except Exception as exc:  # noqa: BLE001 - one failing part must not hide the others
            traceback.print_exc()
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            row["status"] = f"failed: {type(exc).__name__}: {first}"
        row["wall_s"] = round(time.monotonic() - t0, 2)
        if self.device == "cuda":
            row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
        if out and isinstance(out.get("peak_gib"), (int, float)):  # a child process measured its own
            row["peak_gib"] = out["peak_gib"]
        return out


def machine() -> dict:
    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
                            "torch": torch.__version__, "cuda": torch.version.cuda}
    for name in ("transformers", "peft", "accelerate", "trl"):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            info[name] = None
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30)
            info["nvidia_smi"] = smi.stdout.strip()
            info["driver"] = smi.stdout.strip().split(", ")[1] if smi.stdout.count(", ") >= 2 else None
    return info


def _child(kind: str, args: dict, timeout: float, torchrun: bool = False) -> dict:
    """bench.gpu.training `kind` in a fresh process; its JSON result."""
    from bench.trainer_dist import _free_port

    prefix = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_addr", "127.0.0.1",
              "--master_port", str(_free_port())] if torchrun else [sys.executable]
    out = Path(args["out"])
    subprocess.run([*prefix, "-m", "bench.gpu.training", kind, json.dumps(args)], cwd=ROOT, check=True, timeout=timeout)
    return json.loads(out.read_text())


def _engine(path: Path, max_batch: int) -> Any:
    from openforge.config import EmbeddedEngineConfig
    from openforge.engine.embedded import EmbeddedEngine

    return EmbeddedEngine(EmbeddedEngineConfig(model=str(path), max_batch_size=max_batch))


def run(plan: Plan, work: Path, *, tiny: bool) -> tuple[dict, list[dict]]:
    import torch

    from bench.gpu import serving
    from openforge.engine.serve import serve_in_thread

    device = "cuda" if torch.cuda.is_available() else "cpu"
    r = Run(plan, device)
    r.results["machine"] = machine()
    r.results["plan"] = {**plan.__dict__, "tiny": tiny, "device": device}
    print(json.dumps(r.results["machine"]), flush=True)
    ckpt, samples, adapter = work / TRAIN_MODEL, work / "samples.json", work / "adapter"
    train = {"model_dir": str(ckpt), "samples": str(samples), "steps": plan.steps}
    r.measure(f"build {TRAIN_MODEL}", lambda: _build(TRAIN_MODEL, ckpt, tiny, device))
    if ckpt.is_dir():
        engine = _engine(ckpt, max(plan.batches))
        try:
            with serve_in_thread(engine.app) as server:
                url = server.url
                r.measure(f"decode {TRAIN_MODEL}", lambda: {"rows": serving.decode(
                    engine, url, batches=plan.batches, new_tokens=plan.new_tokens, repeats=plan.repeats)})
                r.measure("prefix cache", lambda: serving.prefix_cache(engine.m, tokens=plan.group_tokens))
                r.measure("grpo batch", lambda: {**serving.sample_batch(
                    url, engine.m.tokenizer, tasks=plan.tasks, group=plan.group, new_tokens=plan.train_new_tokens,
                    path=samples), "engine_dtype": str(engine.m.dtype).removeprefix("torch.")})
                if samples.exists():
                    r.measure("grpo step forge", lambda: _child("ours", {
                        **train, "out": str(work / "ours.json"), "adapter_out": str(adapter)}, plan.child_timeout_s))
                if adapter.is_dir():
                    r.measure("lora hot-load", lambda: serving.lora_hot_load(url, adapter))
        finally:
            engine.close()
            del engine
            if device == "cuda":
                torch.cuda.empty_cache()
    if samples.exists():
        r.measure("grpo step trl", lambda: _trl(plan, train, work))
        r.measure("grpo step forge fsdp2", lambda: _child("fsdp", {**train, "out": str(work / "fsdp.json")},
                                                          plan.child_timeout_s, torchrun=True))
    for name in plan.decode_models:
        if name != TRAIN_MODEL:
            r.measure(f"build {name}", lambda: _build(name, work / name, tiny, device))
            if (work / name).is_dir():
                r.measure(f"decode {name}", lambda: {"rows": _decode_alone(work / name, plan)})
    r.results["total_wall_s"] = round(time.monotonic() - r.start, 1)
    return r.results, r.parts


def _build(name: str, path: Path, tiny: bool, device: str) -> dict:
    models.build_checkpoint(name, path, tiny=tiny, device=device)
    return {"parameters": models.parameters(path), "shape": models.shape(name, tiny=tiny)}


def _trl(plan: Plan, train: dict, work: Path) -> dict:
    if importlib.util.find_spec("trl") is None or importlib.util.find_spec("datasets") is None:
        return {"_status": "skipped: trl/datasets not importable here (the device gets them from .whl: bench/gpu/prepare.sh)"}
    return _child("trl", {**train, "out": str(work / "trl.json"), "work": str(work / "trl"), "group": plan.group,
                          "tasks": plan.tasks, "new_tokens": plan.train_new_tokens}, plan.child_timeout_s)


def _decode_alone(path: Path, plan: Plan) -> list[dict]:
    from bench.gpu import serving
    from openforge.engine.serve import serve_in_thread

    engine = _engine(path, max(plan.batches))
    try:
        with serve_in_thread(engine.app) as server:
            return serving.decode(engine, server.url, batches=plan.batches, new_tokens=plan.new_tokens,
                                  repeats=plan.repeats)
    finally:
        engine.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.main", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for gpu.json and gpu.md")
    parser.add_argument("--dry-run", action="store_true", help="the same parts on the CPU at toy size")
    parser.add_argument("--work", type=Path, help="scratch folder for checkpoints (default: a temporary one)")
    args = parser.parse_args(argv)
    plan = dry_plan() if args.dry_run else Plan()
    args.out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        work = args.work or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="forge-gpu-")))
        results, parts = run(plan, work, tiny=args.dry_run)
    record = {"name": "gpu", "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "quick": args.dry_run,
              "machine": results["machine"], "results": {**results, "parts": parts}}
    (args.out / "gpu.json").write_text(json.dumps(record, indent=1, default=str))
    (args.out / "gpu.md").write_text(report.markdown(record))
    print((args.out / "gpu.md").read_text(), flush=True)
    failed = [p["part"] for p in parts if p["status"].startswith("failed")]
    if failed:
        print(f"bench/gpu: FAILED parts: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
