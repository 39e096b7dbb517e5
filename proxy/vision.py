"""The served model's image placeholders: how many tokens each image of a prompt becomes.

A VLM's chat template writes one placeholder per image (Qwen2-VL: `<|vision_start|><|image_pad|>
<|vision_end|>`); its processor then repeats the pad N times, N = t*h*w / merge^2 of the image's
patch grid after its own resize. The proxy does the same with the model's own processor
(engine/vision.py, shared with the engine and the trainer), so the recorded prompt ids are exactly
the ids the engine reads, and the engine's check of each run against its image holds.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any, Sequence

from openforge.errors import ConfigError
from openforge.image_store import ImageError
from openforge.engine.vision import is_vision_model
from openforge.proxy.calls import bad_request


class ImagePlaceholders:
    """A VLM's processor, as the proxy uses it: expand the placeholders of rendered prompt ids."""

    def __init__(self, processor: Any) -> None:
        from openforge.engine.vision import VisionTokens

        self.processor = processor
        self.tokens = VisionTokens.from_processor(processor)

    @property
    def image_token_id(self) -> int:
        return self.tokens.image_token_id

    def expand(self, ids: list[int], images: Sequence[Any]) -> list[int]:
        """`ids` (freshly tokenised text: one pad per image) with each image's pad repeated to its
        token count; `images` are the `ImageInput`s those pads stand for, in order."""
        from openforge.engine.vision import expand_with_grid

        try:
            return expand_with_grid(ids, self.grid(images), self.tokens)
        except ImageError as exc:
            raise bad_request(f"the images do not match the prompt's image placeholders: {exc} (text that spells "
                              "a placeholder token, or a chat template that drops an image)") from None
        except (ValueError, OSError, SyntaxError) as exc:
            raise bad_request(f"the model's image processor refused an image: {exc}") from None

    def grid(self, images: Sequence[Any]) -> Any:
        """[n, 3] patch grids (t, h, w) of `images`. From each image's size alone where the image
        processor is Qwen2-VL's: its own module's smart_resize, as its preprocessing runs it, checked
        against its `get_number_of_image_patches` (what vLLM counts placeholders with). ~0.1 ms
        instead of ~100 ms of resizing and normalising a screenshot's pixels, which only the engine
        needs. Any other processor: by running it."""
        import torch

        from openforge.engine.vision import pixel_inputs

        if not images:
            return torch.zeros((0, 3), dtype=torch.long)
        proc = getattr(self.processor, "image_processor", self.processor)
        resize = getattr(sys.modules.get(type(proc).__module__), "smart_resize", None)
        count = getattr(proc, "get_number_of_image_patches", None)
        if resize is None or count is None:
            return pixel_inputs([im.data for im in images], self.processor)[1]
        from PIL import Image

        rows = []
        for i, im in enumerate(images):
            try:
                with Image.open(io.BytesIO(im.data)) as img:  # the header only: no pixels decoded
                    width, height = img.size
            except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
                raise ImageError(f"image {i} is not a readable image: {exc}") from None
            h, w = resize(height, width, proc.patch_size * proc.merge_size, min_pixels=proc.size["shortest_edge"],
                          max_pixels=proc.size["longest_edge"])
            grid = [1, h // proc.patch_size, w // proc.patch_size]  # an image is one temporal patch
            if grid[1] * grid[2] != int(count(height, width)):  # a processor that resizes differently
                return pixel_inputs([im.data for im in images], self.processor)[1]
            rows.append(grid)
        return torch.tensor(rows, dtype=torch.long)


def load_placeholders(model_path: str | Path) -> ImagePlaceholders | None:
    """The model's image placeholders, or None for a text-only model (which is then refused images)."""
    if not is_vision_model(model_path):
        return None
    from openforge.engine.vision import load_processor

    try:
        return ImagePlaceholders(load_processor(model_path))
    except (OSError, ValueError, KeyError, ImportError) as exc:
        raise ConfigError(f"cannot load the image processor of {model_path}: {str(exc).splitlines()[0]}") from None
