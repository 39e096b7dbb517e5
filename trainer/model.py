"""The policy the trainer updates: a HF causal LM with a PEFT LoRA adapter (or all weights), its
optimizer and LR schedule. Loaded with the same code that loads a real Qwen2.5/Qwen3 folder."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import torch

from openforge.config import TrainerConfig
from openforge.errors import ConfigError, TrainerError
from openforge.trainer.grpo import lr_lambda

# PeftModel.__init__ reads transformers 5's deprecated `is_gradient_checkpointing`: a FutureWarning on
# every adapter made or loaded, about code that is not ours.
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"trainer.device {name!r} is not a torch device (auto, cpu, cuda, cuda:1)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device is cuda but torch sees no GPU; use auto or cpu")
    return device


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """bf16 autocast on GPUs that have it; fp32 elsewhere (CPU bf16 is slow and would break the
    fp32 engine/trainer logprob match the tests rely on)."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None


def build_policy(model_path: str | Path, cfg: TrainerConfig, *, device: torch.device,
                 resume_from: Path | None = None) -> Any:
    """Load the base model in fp32 and wrap it: a fresh LoRA adapter, the one at `resume_from`, or else
    the one trainer.init_from names (an SFT result; checked by `check_init_adapter`).

    A vision-language checkpoint (a Qwen2-VL: its config has a vision tower) loads as
    AutoModelForImageTextToText; LoRA then targets the language model's modules only and the vision
    tower stays frozen (full fine-tuning too): the policy learns what to do with what it sees, and
    the engine's image features stay those of the base weights."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from openforge.trainer.vision import is_vision_model

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the weight-loading bar would break `forge up --headless`'s lines
    source = resume_from if (cfg.full_finetune and resume_from is not None) else model_path
    vision = is_vision_model(source)
    auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    try:
        model = auto.from_pretrained(str(source), dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load the model at {source}: {str(exc).splitlines()[0]}") from None
    model.config.use_cache = False  # training never decodes; the cache only costs memory
    if cfg.full_finetune:
        if vision:
            for name, param in model.named_parameters():
                if ".visual." in f".{name}":
                    param.requires_grad_(False)
        return model.to(device)

    from peft import LoraConfig, PeftModel, get_peft_model

    start = resume_from or (check_init_adapter(cfg.init_from, cfg, vision=vision) if cfg.init_from else None)
    if start is not None:
        model = PeftModel.from_pretrained(model, str(start), is_trainable=True)
    else:
        targets = lora_targets(cfg, vision=vision)
        lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                          target_modules=targets, task_type="CAUSAL_LM")
        try:
            model = get_peft_model(model, lora)
        except ValueError as exc:
            raise ConfigError(f"trainer.lora_target_modules: {str(exc).splitlines()[0]}") from None
    return model.to(device)


def lora_targets(cfg: TrainerConfig, *, vision: bool) -> list[str] | str:
    """The modules a fresh LoRA adapts: trainer.lora_target_modules, or on a vision-language model the
    language model's modules only (a regex PEFT full-matches against module names)."""
    if vision:
        return r".*language_model\..*\.(" + "|".join(re.escape(t) for t in cfg.lora_target_modules) + ")"
    return list(cfg.lora_target_modules)


def check_init_adapter(path: str | Path, cfg: TrainerConfig, *, vision: bool = False) -> Path:
    """`path` as the adapter a run's LoRA starts from (trainer.init_from): a PEFT LoRA folder whose rank
    and target modules are the run's, so the run trains (and saves) the adapter it was given."""
    folder = Path(path)
    if cfg.full_finetune:
        raise ConfigError("trainer.init_from starts a LoRA adapter; full fine-tuning starts from engine.model")
    try:
        saved = json.loads((folder / "adapter_config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--init-from {folder}: not a PEFT adapter folder (adapter_config.json: "
                          f"{getattr(exc, 'strerror', None) or exc})") from None
    targets = saved.get("target_modules")
    want = lora_targets(cfg, vision=vision)
    same_targets = set(targets) == set(want) if isinstance(targets, list) and isinstance(want, list) else targets == want
    if saved.get("peft_type", "LORA") != "LORA" or saved.get("r") != cfg.lora_r or not same_targets:
        raise ConfigError(f"--init-from {folder}: the adapter is {saved.get('peft_type', '?')} r={saved.get('r')} on "
                          f"{targets}, the run trains LoRA r={cfg.lora_r} on {want} (set trainer.lora_r / "
                          "trainer.lora_target_modules to the adapter's)")
    return folder


def build_optimizer(model: Any, cfg: TrainerConfig) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW over the trainable weights, with warmup + the configured schedule per optimizer step."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise TrainerError("the model has no trainable weights (LoRA target modules matched nothing?)")
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    total = max(cfg.steps * cfg.epochs_per_step, 1)
    schedule = lr_lambda(cfg.lr_schedule, total_steps=total, warmup_steps=cfg.warmup_steps * cfg.epochs_per_step)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def pad_token_id(model: Any) -> int:
    config = getattr(model, "config", None)
    for key in ("pad_token_id", "eos_token_id"):
        value = getattr(config, key, None)
        if isinstance(value, list):
            value = value[0] if value else None
        if value is not None:
            return int(value)
    return 0
