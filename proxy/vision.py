"""The served model's image placeholders: how many tokens each image of a prompt becomes.

A VLM's chat template writes one placeholder per image (Qwen2-VL: `<|vision_start|><|image_pad|>
<|vision_end|>`); its processor then repeats the pad N times, N = t*h*w / merge^2 of the image's
patch grid after its own resize. The proxy does the same with the model's own processor
(engine/vision.py, shared with the engine and the trainer), so the recorded prompt ids are exactly
the ids the engine reads, and the engine's check of each run against its image holds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from openforge.errors import ConfigError
from openforge.images import ImageError
from proxy.calls import bad_request


class ImagePlaceholders:
    """A VLM's processor, as the proxy uses it: expand the placeholders of rendered prompt ids."""

    def __init__(self, processor: Any) -> None:
        from engine.vision import VisionTokens

        self.processor = processor
        self.tokens = VisionTokens.from_processor(processor)

    @property
    def image_token_id(self) -> int:
        return self.tokens.image_token_id

    def expand(self, ids: list[int], images: Sequence[Any]) -> list[int]:
        """`ids` (freshly tokenised text: one pad per image) with each image's pad repeated to its
        token count; `images` are the `ImageInput`s those pads stand for, in order."""
        from engine.vision import expand_with_grid, pixel_inputs

        try:
            if images:
                _, grid = pixel_inputs([im.data for im in images], self.processor)
            else:
                import torch

                grid = torch.zeros((0, 3), dtype=torch.long)
            return expand_with_grid(ids, grid, self.tokens)
        except ImageError as exc:
            raise bad_request(f"the images do not match the prompt's image placeholders: {exc} (text that spells "
                              "a placeholder token, or a chat template that drops an image)") from None
        except (ValueError, OSError) as exc:
            raise bad_request(f"the model's image processor refused an image: {exc}") from None


def is_vision_model(path: str | Path) -> bool:
    cfg = Path(path).expanduser() / "config.json"
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "vision_config" in data


def load_placeholders(model_path: str | Path) -> ImagePlaceholders | None:
    """The model's image placeholders, or None for a text-only model (which is then refused images)."""
    if not is_vision_model(model_path):
        return None
    from engine.vision import load_processor

    try:
        return ImagePlaceholders(load_processor(model_path))
    except (OSError, ValueError, KeyError, ImportError) as exc:
        raise ConfigError(f"cannot load the image processor of {model_path}: {str(exc).splitlines()[0]}") from None
