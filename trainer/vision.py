"""Multimodal trajectories in the trainer: pixel values re-created from the run's stored images.

A trajectory segment of a vision-language model lists its images (`Trajectory.images`: sha256 ids,
in the order their placeholder runs appear in `token_ids`); the bytes are in the run's ImageStore,
exactly as the harness sent them. `TrajectoryImages.inputs(traj)` reads them back and runs the
model's own image processor (engine/vision.py, the same code the engine and proxy use), so the
trainer's forward pass sees the pixels the engine sampled from. Every placeholder run is checked
against its image's grid: a mismatch is an error, never a silent truncation.

The processor is loaded on the first multimodal row, so a text-only run never touches it.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from openforge.engine.vision import is_vision_model
from openforge.errors import TrainerError
from openforge.image_store import ImageError, ImageStore

CACHED_IMAGES = 512  # processed images kept between rows and steps (pixel values, by sha256)


class TrajectoryImages:
    """Pixel inputs of a run's trajectory segments, from its ImageStore and the model's processor."""

    def __init__(self, images: ImageStore, model_path: str | Path) -> None:
        self.images = images
        self.model_path = Path(model_path)
        self._processor: Any = None
        self._tokens: Any = None
        # sha -> (pixels, grid [1, 3]), least recently used first; bounded, as a GUI run's screenshots
        # are many and each step reads mostly its own
        self._pixels: OrderedDict[str, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()

    @classmethod
    def for_run(cls, home: Path, run_id: str, model_path: str | Path) -> TrajectoryImages:
        return cls(ImageStore.for_run(home, run_id), model_path)

    def _load(self) -> None:
        if self._processor is not None:
            return
        from openforge.engine.vision import VisionTokens, load_processor

        if not is_vision_model(self.model_path):
            raise TrainerError(f"trajectories hold images but the model at {self.model_path} has no vision tower")
        try:
            self._processor = load_processor(self.model_path)
        except (OSError, ValueError) as exc:
            raise TrainerError(f"cannot load the image processor of {self.model_path}: {str(exc).splitlines()[0]}") from None
        self._tokens = VisionTokens.from_processor(self._processor)

    def _image(self, sha: str) -> tuple[torch.Tensor, torch.Tensor]:
        from openforge.engine.vision import pixel_inputs

        if sha in self._pixels:  # a group's rollouts share their prompt's images: process each once
            self._pixels.move_to_end(sha)
            return self._pixels[sha]
        out = self._pixels[sha] = pixel_inputs([self.images.get(sha)], self._processor)
        while len(self._pixels) > CACHED_IMAGES:
            self._pixels.popitem(last=False)
        return out

    def inputs(self, traj: Any, token_ids: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(pixel_values [patches, D], image_grid_thw [n, 3]) of a segment with images, checked
        against its placeholder runs. TrainerError when an image is missing or does not fit."""
        from openforge.engine.vision import check_expanded

        where = f"trajectory {traj.rollout_id}/{traj.segment}"
        self._load()
        try:
            parts = [self._image(sha) for sha in traj.images]
            pixels = torch.cat([p for p, _ in parts])
            grid = torch.cat([g for _, g in parts])
            check_expanded(token_ids if token_ids is not None else traj.token_ids or [], grid, self._tokens)
        except ImageError as exc:
            raise TrainerError(f"{where}: {exc}") from None
        return pixels, grid


def rope_module(model: Any) -> Any:
    """The module whose `get_rope_index` computes the model's M-RoPE positions (through PEFT and
    DDP wrappers); None for a text model."""
    for module in model.modules():
        if hasattr(type(module), "get_rope_index"):
            return module
    return None


def vision_forward_kwargs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> dict[str, Any]:
    """What a Qwen2-VL forward pass needs besides the ids: pixels, grids, and the M-RoPE positions
    [3, B, T] computed by the model's own `get_rope_index` (passed explicitly, so the HF model's
    cached `rope_deltas` from an earlier pass never leak into this one)."""
    inner = rope_module(model)
    if inner is None:
        raise TrainerError("a micro-batch holds images but the model has no vision tower (get_rope_index)")
    image_token_id = int(inner.config.image_token_id)
    types = (input_ids == image_token_id).to(torch.int32)
    with torch.no_grad():
        positions, _ = inner.get_rope_index(input_ids, mm_token_type_ids=types, image_grid_thw=image_grid_thw,
                                            attention_mask=attention_mask)
    return {"pixel_values": pixel_values, "image_grid_thw": image_grid_thw, "position_ids": positions,
            "mm_token_type_ids": types}
