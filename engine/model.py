"""Loading a local HF checkpoint for serving: a causal LM (the tiny model, a real Qwen/Llama folder) or a
vision-language model (Qwen2-VL: the model, its tokenizer and its image processor)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openforge.engine.vision import is_vision_model
from openforge.errors import EngineError
from openforge.paths import default_tiny_model, forge_home


@dataclass
class LoadedModel:
    model: Any  # a transformers PreTrainedModel, in eval mode
    tokenizer: Any
    path: Path
    device: Any  # torch.device
    dtype: Any  # torch.dtype
    eos_ids: set[int]
    context_length: int
    image_processor: Any = None  # a VLM's HF image processor (pixel values from image bytes)
    vision: Any = None  # engine.vision.VisionTokens of a VLM, None for a text model


def resolve_model_path(model: str) -> Path:
    """The checkpoint folder to serve; empty means the tiny model in FORGE_HOME (built on first use)."""
    if not model:
        path = default_tiny_model(forge_home())
        if not (path / "config.json").is_file():
            from openforge.engine.tiny import build_tiny_model

            build_tiny_model(path)
        return path
    path = Path(model).expanduser()
    if not path.exists():
        raise EngineError(f"model path {path} does not exist (build the tiny model with `forge model tiny {path}`)")
    if not (path / "config.json").is_file():
        raise EngineError(f"model path {path} is not a Hugging Face checkpoint folder (no config.json)")
    return path


def resolve_device(device: str) -> Any:
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise EngineError(f"unknown torch device {device!r}: {exc}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise EngineError(f"device {device!r} was asked for but this torch has no CUDA device")
    return dev


def resolve_dtype(dtype: str, device: Any) -> Any:
    import torch

    if dtype == "auto":
        # fp32 on CPU keeps the returned logprobs exact against the trainer's fp32 forward pass.
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype)


def _eos_ids(path: Path, model: Any, tokenizer: Any) -> set[int]:
    """Every token that ends a completion: generation_config's eos ids, the tokenizer's, and <|im_end|>."""
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for raw in (getattr(gen, "eos_token_id", None), getattr(model.config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(raw, int):
            ids.add(raw)
        elif isinstance(raw, list):
            ids.update(int(t) for t in raw)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tokenizer.get_vocab() else None
    if im_end is not None:
        ids.add(int(im_end))
    return ids


def load_model(model: str, *, dtype: str = "auto", device: str = "auto") -> LoadedModel:
    """Load a causal LM (`AutoModelForCausalLM`) or a VLM (`AutoModelForImageTextToText` + its image
    processor) and its tokenizer from a local folder, or raise one clear EngineError."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from openforge.engine.attention import use_split_attention
    from openforge.engine.vision import VisionTokens

    hf_logging.disable_progress_bar()  # the weight-loading bar would fill the engine's log
    path = resolve_model_path(model)
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    vlm = is_vision_model(path)
    image_processor = None
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        if vlm:
            from transformers import AutoImageProcessor

            hf = AutoModelForImageTextToText.from_pretrained(str(path), dtype=torch_dtype)
            image_processor = AutoImageProcessor.from_pretrained(str(path))
        else:
            hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype)
    except (OSError, ValueError, KeyError, ImportError, json.JSONDecodeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        kind = "vision-language model" if vlm else "causal LM"
        raise EngineError(f"cannot load a {kind} from {path}: {first}") from None
    hf.to(dev).eval()
    use_split_attention(hf)  # prompt chunks on a KV cache without a materialised mask (engine/attention.py)
    text_config = hf.config.get_text_config()
    ctx = int(getattr(text_config, "max_position_embeddings", 0) or 32768)
    vision = VisionTokens.from_config(hf.config) if vlm else None
    if vlm and vision is None:
        raise EngineError(f"{path} has a vision_config but no image_token_id: not a Qwen2-VL-style model")
    return LoadedModel(hf, tokenizer, path, dev, torch_dtype, _eos_ids(path, hf, tokenizer), ctx,
                       image_processor, vision)
