"""Images in a /generate request (SGLang's `image_data`) for a Qwen2-VL model in the embedded engine.

The request's `input_ids` hold each image's placeholder run expanded as the model's HF processor
expands it (`<|vision_start|>` + N x `<|image_pad|>` + `<|vision_end|>`, N = t*h*w / merge^2 of the
image's patch grid); `image_data` has one `data:image/...;base64,...` URL per run, in order. A run of
one `<|image_pad|>` is expanded here to the image's N (as SGLang's `_expand_input_ids` does for
pre-tokenized prompts), so both forms SGLang takes are taken. `prepare_images` decodes the images,
recomputes their pixel values with the model's image processor (engine/vision.py's `pixel_inputs`,
the one the proxy and the trainer use), checks every run against its image (a 400 otherwise: the
engine never guesses which image a run means) and computes what the scheduler needs:

    mm = prepare_images(loaded, input_ids, image_data, cache)   # cache: ImageCache of decoded images
    mm.input_ids      the prompt with every placeholder run expanded
    mm.key_ids        input_ids with each image's placeholder tokens replaced by the image's pad value
                      (a hash of its pixels), the prefix cache's key: two images behind the same
                      placeholder tokens never share KV (SGLang's `pad_value`, negative here so it can
                      never equal a real token id)
    mm.positions      [3, L] M-RoPE positions of the prompt (HF's get_rope_index), mm.rope_delta the
                      offset of every later token (position = index + delta on all three axes)
    mm.vision_inputs(start, stop)   pixel_values / image_grid_thw of the images whose runs lie in
                      [start, stop): a forward pass over part of the prompt gets exactly its images

Remote URLs and file paths are refused: the engine must not fetch the network or read files for a
caller (SGLang would load both).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from openforge.engine.protocol import BadRequest
from openforge.engine.vision import VisionTokens, mm_token_type_ids, open_image, pixel_inputs, placeholder_runs
from openforge.image_store import ImageError


@dataclass
class ImagePrompt:
    """The images of one prompt, aligned with its placeholder runs."""

    input_ids: list[int]  # the prompt, every placeholder run expanded
    pixel_values: list[torch.Tensor]  # per image: [patches, channels * t * patch^2]
    grid_thw: torch.Tensor  # [images, 3]
    runs: list[tuple[int, int]]  # each image's placeholder run: [start, stop) in input_ids
    key_ids: list[int]
    positions: torch.Tensor  # [3, len(input_ids)]
    rope_delta: int

    def safe_prefix(self, n: int) -> int:
        """`n` cached tokens, cut back to the start of an image run it ends inside (an image's KV is
        reused whole or recomputed whole: its vision features come from one encoder pass)."""
        for start, stop in self.runs:
            if start < n < stop:
                return start
        return n

    def chunk_end(self, stop: int) -> int:
        """A chunk's end moved past any image run it would cut (a run is computed in one chunk)."""
        for start, end in self.runs:
            if start < stop < end:
                return end
        return stop

    def images_in(self, start: int, stop: int) -> list[int]:
        inside = []
        for i, (a, b) in enumerate(self.runs):
            if start <= a and b <= stop:
                inside.append(i)
            elif a < stop and b > start:  # the scheduler's chunking and cache matching never do this
                raise ValueError(f"image {i}'s placeholder run [{a}, {b}) is cut by the span [{start}, {stop})")
        return inside

    def vision_inputs(self, start: int, stop: int) -> dict[str, torch.Tensor]:
        idx = self.images_in(start, stop)
        if not idx:
            return {}
        return {"pixel_values": torch.cat([self.pixel_values[i] for i in idx]), "image_grid_thw": self.grid_thw[idx]}


def image_data_list(body: dict[str, Any]) -> list[str]:
    """SGLang's `image_data` of one request: a list of strings (a lone string is one image)."""
    raw = body.get("image_data")
    if raw is None:
        return []
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or any(isinstance(x, list) for x in raw):
        raise BadRequest("image_data must be a list of data URLs, one per image (batched requests are not supported)")
    for i, item in enumerate(raw):
        if not isinstance(item, str):
            raise BadRequest(f"image_data[{i}] must be a data URL string (data:image/<format>;base64,...)")
    return raw


def decode_data_url(url: str, index: int) -> bytes:
    """The bytes of one `data:image/<fmt>;base64,...` URL; anything else is refused."""
    head = url[:16].lower()
    if head.startswith(("http://", "https://")):
        raise BadRequest(f"image_data[{index}] is a remote URL: this engine does not fetch images; "
                         "send the image's bytes as a data URL (data:image/<format>;base64,...)")
    if not head.startswith("data:"):
        raise BadRequest(f"image_data[{index}] must be a data URL (data:image/<format>;base64,...); "
                         "file paths and other sources are not read by this engine")
    meta, sep, payload = url.partition(",")
    if not sep or not meta.lower().startswith("data:image/") or not meta.lower().endswith(";base64"):
        raise BadRequest(f"image_data[{index}] must be a base64 image data URL (data:image/<format>;base64,...)")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"image_data[{index}] is not valid base64") from None


def _check_no_video(loaded: Any, ids: list[int]) -> None:
    video = getattr(loaded.model.config, "video_token_id", None)
    if video is not None and video in ids:
        raise BadRequest("input_ids holds video placeholder tokens: this engine does not take videos")


def check_text_only(loaded: Any, ids: list[int]) -> None:
    """A request with no images must not hold image placeholders (they would be read as text)."""
    spec: VisionTokens | None = loaded.vision
    if spec is None:
        return
    n = len(placeholder_runs(ids, spec.image_token_id))
    if n:
        raise BadRequest(f"input_ids has {n} image placeholder run(s) but the request has no image_data")
    _check_no_video(loaded, ids)


def pad_value(pixels: torch.Tensor, grid: torch.Tensor) -> int:
    """The prefix cache's stand-in for an image's placeholder tokens: a hash of its pixels and grid,
    negative (never a token id). SGLang keys its radix cache the same way (`pad_value` = hash)."""
    h = hashlib.sha256(grid.to(torch.int64).numpy().tobytes())
    h.update(pixels.detach().to(torch.float32).contiguous().numpy().tobytes())
    return -1 - (int.from_bytes(h.digest()[:8], "big") >> 1)


class ImageCache:
    """Decoded, processed images by their data URL's bytes (an LRU of `size` entries).

    A GUI agent resends every earlier screenshot each turn; decoding a 1280x800 PNG and resizing
    it costs ~30 ms here, the model's whole prefill of it less. Keyed by sha256 of the payload."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._items: OrderedDict[bytes, tuple[torch.Tensor, torch.Tensor, int]] = OrderedDict()
        self._lock = threading.Lock()  # requests prepare their images in worker threads

    def get(self, digest: bytes) -> tuple[torch.Tensor, torch.Tensor, int] | None:
        with self._lock:
            item = self._items.get(digest)
            if item is not None:
                self._items.move_to_end(digest)
            return item

    def put(self, digest: bytes, item: tuple[torch.Tensor, torch.Tensor, int]) -> None:
        with self._lock:
            self._items[digest] = item
            self._items.move_to_end(digest)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


def _process(loaded: Any, urls: list[str], cache: ImageCache | None) -> tuple[list[torch.Tensor], torch.Tensor,
                                                                                list[int]]:
    """Per-image pixel values, the [n, 3] grid and each image's pad value (engine/vision.pixel_inputs)."""
    data = [decode_data_url(url, i) for i, url in enumerate(urls)]
    digests = [hashlib.sha256(d).digest() for d in data]
    todo = [i for i, dg in enumerate(digests) if cache is None or cache.get(dg) is None]
    fresh: dict[int, tuple[torch.Tensor, torch.Tensor, int]] = {}
    if todo:
        images = []
        for i in todo:
            try:
                images.append(open_image(data[i], i))
            except ImageError as exc:
                raise BadRequest(f"image_data[{i}] is not a readable image: {str(exc).partition(': ')[2]}") from None
        try:
            pixels, grid = pixel_inputs(images, loaded.image_processor)
        except (ValueError, OSError) as exc:
            raise BadRequest(f"the model's image processor refused an image: {exc}") from None
        for i, px, g in zip(todo, torch.split(pixels, grid.prod(-1).tolist()), grid):
            fresh[i] = (px, g, pad_value(px, g))
            if cache is not None:
                cache.put(digests[i], fresh[i])
    # Other requests' images may have evicted an entry since the first look: then process all afresh.
    items = [fresh.get(i) or cache.get(dg) for i, dg in enumerate(digests)]  # type: ignore[union-attr]
    if any(it is None for it in items):
        return _process(loaded, urls, None)
    return [it[0] for it in items], torch.stack([it[1] for it in items]), [it[2] for it in items]


def mrope_positions(model: Any, ids: list[int], grid: torch.Tensor, spec: VisionTokens) -> tuple[torch.Tensor, int]:
    """[3, L] M-RoPE positions and the rope delta, by the model's own `get_rope_index`."""
    t = torch.tensor([ids])
    inner = getattr(model, "model", model)
    pos, delta = inner.get_rope_index(t, mm_token_type_ids=mm_token_type_ids(t, spec), image_grid_thw=grid)
    return pos[:, 0, :].cpu(), int(delta.reshape(-1)[0])


def prepare_images(loaded: Any, ids: list[int], image_data: list[str], cache: ImageCache | None = None) -> ImagePrompt:
    """Decode, process and check a request's images against its placeholder runs (see the module doc)."""
    spec: VisionTokens | None = loaded.vision
    if spec is None:
        raise BadRequest("this model does not take images (image_data was sent to a text-only model)")
    _check_no_video(loaded, ids)
    runs = placeholder_runs(ids, spec.image_token_id)
    if len(runs) != len(image_data):
        raise BadRequest(f"input_ids has {len(runs)} image placeholder run(s) but image_data has "
                         f"{len(image_data)} image(s); each image needs its run, in order")
    for i, (start, stop) in enumerate(runs):
        if start == 0 or ids[start - 1] != spec.vision_start_id or stop >= len(ids) or ids[stop] != spec.vision_end_id:
            raise BadRequest(f"image {i}'s placeholder run (tokens {start}..{stop - 1}) is not enclosed in "
                             "<|vision_start|> ... <|vision_end|>")
    pixels, grid, pads = _process(loaded, image_data, cache)
    expanded, key, spans = [], [], []
    done = 0
    for i, ((start, stop), g) in enumerate(zip(runs, grid.tolist())):
        n = g[0] * g[1] * g[2] // spec.merge_size ** 2
        if stop - start != n and stop - start != 1:  # one pad: the unexpanded form, expanded below
            raise BadRequest(f"image {i}'s placeholder run has {stop - start} tokens but the image is {n} tokens "
                             f"(grid {g[0]}x{g[1]}x{g[2]} / {spec.merge_size}^2) for this model's processor")
        expanded += ids[done:start]
        key += ids[done:start]
        spans.append((len(expanded), len(expanded) + n))
        expanded += [spec.image_token_id] * n
        key += [pads[i]] * n
        done = stop
    expanded += ids[done:]
    key += ids[done:]
    positions, delta = mrope_positions(loaded.model, expanded, grid, spec)
    return ImagePrompt(expanded, pixels, grid, spans, key, positions, delta)
