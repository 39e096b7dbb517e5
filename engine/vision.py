"""One way to turn images into a VLM's inputs, shared by the proxy, the engine and the trainer.

For a Qwen2-VL-style model (engine/tiny_vl.py builds a tiny one) an image is two things:

    pixel_inputs(images, processor) -> (pixel_values [patches, C*t*p*p], image_grid_thw [n, 3])
        the model's own image processor on the decoded bytes (resize by smart_resize, normalise,
        patchify): exactly what the vision tower reads
    expand_image_tokens(ids, images, processor) -> ids
        each `<|image_pad|>` of a rendered prompt (one per image, between `<|vision_start|>` and
        `<|vision_end|>`, as the chat template writes it) repeated N times, N = t*h*w / merge^2 of
        that image's grid: exactly what `Qwen2VLProcessor.__call__` does to the text

`images` are the encoded bytes (PNG/JPEG/GIF/WebP) as the client sent them and the ImageStore keeps
them; a list of PIL images works too. `load_processor(path)` gives the checkpoint's real
`Qwen2VLProcessor`: `AutoProcessor` when it loads, else (transformers 5 needs torchvision for the
video processor, which this venv leaves out) the same class built from the folder's tokenizer and
PIL image processor with no video processor (images only; videos are refused anyway).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from openforge.image_store import ImageError


@dataclass(frozen=True)
class VisionTokens:
    """The placeholder token ids and merge size of a Qwen2-VL-style model."""

    image_token_id: int
    vision_start_id: int
    vision_end_id: int
    merge_size: int

    @classmethod
    def from_config(cls, config: Any) -> VisionTokens | None:
        """None for a text-only model."""
        vision = getattr(config, "vision_config", None)
        if vision is None or getattr(config, "image_token_id", None) is None:
            return None
        return cls(int(config.image_token_id), int(config.vision_start_token_id), int(config.vision_end_token_id),
                   int(getattr(vision, "spatial_merge_size", 2)))

    @classmethod
    def from_processor(cls, processor: Any) -> VisionTokens:
        tok = processor.tokenizer
        return cls(int(tok.convert_tokens_to_ids(getattr(processor, "image_token", "<|image_pad|>"))),
                   int(tok.convert_tokens_to_ids("<|vision_start|>")), int(tok.convert_tokens_to_ids("<|vision_end|>")),
                   int(processor.image_processor.merge_size))


def is_vision_model(path: str | Path) -> bool:
    """A checkpoint folder of a vision-language model: its config.json has a vision tower. The one
    check the proxy, the trainer and `forge model` use."""
    cfg = Path(path).expanduser() / "config.json"
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "vision_config" in data


def load_processor(path: str | Path) -> Any:
    """The checkpoint's `Qwen2VLProcessor` (module doc: without torchvision, images only)."""
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    path = str(Path(path).expanduser())
    try:
        return AutoProcessor.from_pretrained(path)
    except ImportError:
        pass
    from transformers import Qwen2VLProcessor

    tokenizer = AutoTokenizer.from_pretrained(path)
    image_processor = AutoImageProcessor.from_pretrained(path)
    # Qwen2VLProcessor.__init__ checks its video processor's class, which without torchvision is a
    # placeholder that cannot be checked; every attribute __init__ sets is set here the same way.
    proc = Qwen2VLProcessor.__new__(Qwen2VLProcessor)
    proc.tokenizer = tokenizer
    proc.image_processor = image_processor
    proc.video_processor = None
    proc.chat_template = getattr(tokenizer, "chat_template", None)
    proc.image_token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
    proc.video_token = getattr(tokenizer, "video_token", None) or "<|video_pad|>"
    proc.image_token_id = tokenizer.convert_tokens_to_ids(proc.image_token)
    proc.video_token_id = tokenizer.convert_tokens_to_ids(proc.video_token)
    return proc


def open_image(data: bytes | Any, index: int = 0) -> Any:
    """A PIL RGB image from encoded bytes (or a PIL image); ImageError for what PIL cannot read."""
    from PIL import Image

    if isinstance(data, Image.Image):
        img = data
    else:
        try:
            img = Image.open(io.BytesIO(bytes(data)))
            img.load()
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
            raise ImageError(f"image {index} is not a readable image: {exc}") from None
    return img.convert("RGB") if img.mode != "RGB" else img


def _image_processor(processor: Any) -> Any:
    return getattr(processor, "image_processor", processor)


def pixel_inputs(images: Sequence[bytes | Any], processor: Any) -> tuple[Any, Any]:
    """(pixel_values, image_grid_thw) of `images` by the model's image processor (a processor or
    the image processor itself); (None, None) for no images."""
    import torch

    if not images:
        return None, None
    pil = [open_image(data, i) for i, data in enumerate(images)]
    out = _image_processor(processor)(images=pil, return_tensors="pt")
    return out["pixel_values"], out["image_grid_thw"].to(torch.long)


def image_token_counts(grid: Any, merge_size: int) -> list[int]:
    """Placeholder tokens per image: t*h*w / merge^2 (Qwen2VLProcessor.replace_image_token)."""
    return [int(t) * int(h) * int(w) // merge_size ** 2 for t, h, w in grid.tolist()]


def placeholder_runs(ids: Sequence[int], token_id: int) -> list[tuple[int, int]]:
    """Maximal runs of `token_id` in `ids`, as [start, stop)."""
    runs: list[tuple[int, int]] = []
    start = None
    for i, t in enumerate(ids):
        if t == token_id and start is None:
            start = i
        elif t != token_id and start is not None:
            runs.append((start, i))
            start = None
    if start is not None:
        runs.append((start, len(ids)))
    return runs


def expand_with_grid(ids: Sequence[int], grid: Any, tokens: VisionTokens) -> list[int]:
    """`ids` with each single image placeholder repeated to its image's token count (grid order)."""
    counts = image_token_counts(grid, tokens.merge_size)
    runs = placeholder_runs(ids, tokens.image_token_id)
    if len(runs) != len(counts):
        raise ImageError(f"the prompt has {len(runs)} image placeholder(s) but {len(counts)} image(s) were given")
    out: list[int] = []
    prev = 0
    for i, ((start, stop), n) in enumerate(zip(runs, counts)):
        if stop - start != 1:
            raise ImageError(f"image {i}'s placeholder is already expanded ({stop - start} tokens)")
        if start == 0 or ids[start - 1] != tokens.vision_start_id or stop >= len(ids) or ids[stop] != tokens.vision_end_id:
            raise ImageError(f"image {i}'s placeholder is not enclosed in <|vision_start|> ... <|vision_end|>")
        out.extend(ids[prev:start])
        out.extend([tokens.image_token_id] * n)
        prev = stop
    out.extend(ids[prev:])
    return out


def expand_image_tokens(ids: Sequence[int], images: Sequence[bytes | Any], processor: Any) -> list[int]:
    """Rendered prompt ids with one `<|image_pad|>` per image -> the ids the model reads (module doc)."""
    _, grid = pixel_inputs(images, processor)
    if grid is None:
        return expand_with_grid(ids, _empty_grid(), VisionTokens.from_processor(processor))
    return expand_with_grid(ids, grid, VisionTokens.from_processor(processor))


def check_expanded(ids: Sequence[int], grid: Any, tokens: VisionTokens) -> list[tuple[int, int]]:
    """The placeholder runs of already-expanded `ids`, checked against the images' grid (one run per
    image, in order, each of its image's length); ImageError otherwise."""
    counts = image_token_counts(grid, tokens.merge_size) if grid is not None else []
    runs = placeholder_runs(ids, tokens.image_token_id)
    if len(runs) != len(counts):
        raise ImageError(f"the token ids hold {len(runs)} image placeholder run(s) but there are {len(counts)} image(s)")
    for i, ((start, stop), n) in enumerate(zip(runs, counts)):
        if stop - start != n:
            raise ImageError(f"image {i}'s placeholder run has {stop - start} tokens but the image is {n} tokens")
    return runs


def mm_token_type_ids(input_ids: Any, tokens: VisionTokens) -> Any:
    """The `mm_token_type_ids` transformers' Qwen2-VL forward and get_rope_index take (1 = image)."""
    import torch

    return (input_ids == tokens.image_token_id).to(torch.int32)


def _empty_grid() -> Any:
    import torch

    return torch.zeros((0, 3), dtype=torch.long)
