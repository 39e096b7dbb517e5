"""`/update_weights_from_disk`: swap the served base weights for a checkpoint of the same architecture."""

from __future__ import annotations

from pathlib import Path

import torch

from openforge.engine.model import LoadedModel
from openforge.errors import EngineError


def _base_name(name: str) -> str | None:
    """A served parameter's name in a plain checkpoint (PEFT wraps targets as `.base_layer`)."""
    if ".lora_" in name or "lora_magnitude_vector" in name:
        return None
    return name.replace(".base_layer.", ".")


def copy_weights_from_disk(m: LoadedModel, path: str) -> None:
    """Copy every weight of the checkpoint at `path` into the served model, in place.

    In place, so loaded LoRA adapters stay attached to the new base weights. Shapes must match."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        raise EngineError(f"{folder} is not a Hugging Face checkpoint folder (no config.json)")
    try:
        auto = AutoModelForImageTextToText if m.vision is not None else AutoModelForCausalLM  # a VLM: same class
        new = auto.from_pretrained(str(folder), dtype=m.dtype)
    except (OSError, ValueError, KeyError) as exc:
        raise EngineError(f"cannot load weights from {folder}: {str(exc).splitlines()[0]}") from None
    source = dict(new.named_parameters())
    source.update(dict(new.named_buffers()))
    targets = [(n, p) for n, p in list(m.model.named_parameters()) if _base_name(n) is not None]
    missing = [n for n, _ in targets if _base_name(n) not in source]
    if missing:
        raise EngineError(f"{folder} does not fit the served model: it has no weight {_base_name(missing[0])!r}")
    for name, param in targets:
        src = source[_base_name(name)]
        if src.shape != param.shape:
            raise EngineError(f"{folder} does not fit the served model: {_base_name(name)} is "
                              f"{tuple(src.shape)}, served {tuple(param.shape)}")
    with torch.no_grad():
        for name, param in targets:
            param.copy_(source[_base_name(name)].to(param.device))
    m.path = folder
