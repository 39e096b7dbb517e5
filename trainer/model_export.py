"""`forge export RUN --format peft|merged`: a run's trained weights, in the layouts other tools load.

    peft     the LoRA adapter as `PeftModel.save_pretrained` writes it: adapter_config.json and
             adapter_model.safetensors. Loads with `PeftModel.from_pretrained(base, DIR)`, SGLang's
             `--lora-paths` and vLLM's `--lora-modules`.
    merged   the base model with the adapter folded in (`merge_and_unload`), or a full fine-tune's
             weights, as safetensors with the base model's tokenizer (and processor, for a vision
             model), chat template included: a plain Hugging Face folder any server loads.

The adapter is loaded the way the trainer loads it (`build_policy`), so what is exported is the model
the run's checkpoint is.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from openforge.config import TrainerConfig
from openforge.engine.vision import is_vision_model
from openforge.errors import TrainerError
from openforge.trainer.model import build_policy

PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors")


def write_peft(adapter: Path, out: Path) -> Path:
    """Copy the checkpoint's PEFT adapter files into `out` (created); returns `out`."""
    missing = [name for name in PEFT_FILES if not (adapter / name).is_file()]
    if missing:
        raise TrainerError(f"{adapter} is not a PEFT adapter folder (no {', '.join(missing)})")
    out.mkdir(parents=True, exist_ok=True)
    for name in PEFT_FILES:
        shutil.copy2(adapter / name, out / name)
    return out


def write_merged(base: Path, checkpoint: Path, out: Path, *, full_finetune: bool) -> Path:
    """The merged model of `checkpoint` (an adapter over `base`, or a full fine-tune's folder) written to
    `out` as safetensors with `base`'s tokenizer and chat template; returns `out`."""
    cfg = TrainerConfig(full_finetune=full_finetune)
    model = build_policy(base, cfg, device=torch.device("cpu"), resume_from=checkpoint)
    if not full_finetune:
        model = model.merge_and_unload()
    # The trainer holds the weights in fp32; the export keeps the base checkpoint's own dtype, so a bf16
    # model leaves as large as it came.
    dtype = _stored_dtype(base)
    if dtype is not None:
        model = model.to(dtype)
    model.config.use_cache = True  # build_policy turns the cache off for training; a server decodes
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    if is_vision_model(base):
        from openforge.engine.vision import load_processor

        load_processor(base).save_pretrained(out)
    else:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(str(base)).save_pretrained(out)
    generation = base / "generation_config.json"
    if generation.is_file():
        shutil.copy2(generation, out / generation.name)
    return out


def _stored_dtype(base: Path) -> torch.dtype | None:
    try:
        data = json.loads((base / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    name = data.get("dtype") or data.get("torch_dtype")
    value = getattr(torch, name, None) if isinstance(name, str) else None
    return value if isinstance(value, torch.dtype) else None
