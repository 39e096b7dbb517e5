"""The embedded engine with images (issue 18): what an image costs a request, on the tiny VLM.

    python -m bench.vl_engine [--quick]

Interleaved, medians over repeats, one engine, requests of 1 new token (so the time is the prompt's):
    text      a text prompt as long as the image prompt (the baseline)
    image     the same length with one 1280x800 PNG screenshot in it, nothing cached: decoding +
              the image processor + the vision tower + the prefill
    decoded   the same with the decoded image in the engine's ImageCache (a screenshot resent in a
              later turn): the vision tower + the prefill
    cached    the image request again: its image's KV comes from the prefix cache (keyed by the
              image's pixel hash), only the last token is computed
    prepare   decoding + the image processor + the checks alone (engine/multimodal.prepare_images)
and the placeholder tokens one screenshot takes with the tiny VLM's processor and with Qwen2-VL's
released settings (min_pixels 56*56, max_pixels 28*28*1280).
"""

from __future__ import annotations

import asyncio
import base64
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _screenshot(size: tuple[int, int], seed: int = 0) -> bytes:
    """A GUI-like image: panels, a few coloured buttons, text-like stripes."""
    import random

    from PIL import Image, ImageDraw

    rnd = random.Random(seed)
    img = Image.new("RGB", size, (245, 245, 245))
    draw = ImageDraw.Draw(img)
    draw.rectangle([0, 0, size[0], 60], fill=(40, 60, 90))
    for _ in range(40):
        x, y = rnd.randrange(size[0] - 200), rnd.randrange(80, size[1] - 30)
        draw.rectangle([x, y, x + rnd.randrange(40, 200), y + 12], fill=tuple(rnd.randrange(256) for _ in range(3)))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def _tokens(processor, size: tuple[int, int]) -> int:
    from PIL import Image

    grid = processor(images=[Image.new("RGB", size)], return_tensors="pt")["image_grid_thw"][0]
    return int(grid.prod()) // processor.merge_size ** 2


async def _request(engine, body: dict) -> float:
    t = time.perf_counter()
    gen = await engine.start(body)
    async for _ in gen.updates():
        pass
    return time.perf_counter() - t


def run(quick: bool = False) -> dict:
    import torch
    from transformers import Qwen2VLImageProcessorPil

    from openforge.engine.embedded import EmbeddedEngine
    from openforge.engine.multimodal import ImageCache, prepare_images
    from openforge.engine.tiny_vl import build_tiny_vl_model
    from openforge.config import EmbeddedEngineConfig

    repeats = 3 if quick else 9
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_vl_model(Path(tmp) / "tiny-vl")
        engine = EmbeddedEngine(EmbeddedEngineConfig(model=str(path), max_batch_size=4))
        torch.set_num_threads(1)  # as `forge engine` runs a small model (engine/embedded.py)
        m = engine.m
        shot = _screenshot((1280, 800))
        url = "data:image/png;base64," + base64.b64encode(shot).decode()
        n_img = _tokens(m.image_processor, (1280, 800))
        spec = m.vision
        text = m.tokenizer.encode("please click the blue button on the settings page " * 4)
        image_ids = text + [spec.vision_start_id] + [spec.image_token_id] * n_img + [spec.vision_end_id] + text
        text_ids = (text * (len(image_ids) // len(text) + 1))[:len(image_ids)]
        params = {"max_new_tokens": 1, "temperature": 0}

        async def measure() -> dict[str, list[float]]:
            times: dict[str, list[float]] = {"text": [], "image": [], "decoded": [], "cached": [], "prepare": []}
            body = {"input_ids": image_ids, "image_data": [url], "sampling_params": params}
            for _ in range(repeats):
                engine.scheduler.flush_prefix_cache()
                times["text"].append(await _request(engine, {"input_ids": text_ids, "sampling_params": params}))
                engine.scheduler.flush_prefix_cache()
                engine.images = ImageCache()
                times["image"].append(await _request(engine, body))
                engine.scheduler.flush_prefix_cache()
                times["decoded"].append(await _request(engine, body))
                times["cached"].append(await _request(engine, body))
                t = time.perf_counter()
                prepare_images(m, image_ids, [url])
                times["prepare"].append(time.perf_counter() - t)
            return times

        times = asyncio.run(measure())
        engine.close()
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    real = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=28 * 28 * 1280)
    out = {
        "prompt_tokens": len(image_ids), "image_tokens": n_img,
        "text_request_ms": round(med["text"], 2), "image_request_ms": round(med["image"], 2),
        "image_vs_text": round(med["image"] / med["text"], 2),
        "decoded_image_request_ms": round(med["decoded"], 2), "decoded_vs_text": round(med["decoded"] / med["text"], 2),
        "image_cached_request_ms": round(med["cached"], 2), "cached_vs_image": round(med["cached"] / med["image"], 2),
        "prepare_images_ms": round(med["prepare"], 2),
        "qwen2vl_release_tokens": {f"{w}x{h}": _tokens(real, (w, h)) for w, h in ((1280, 800), (1920, 1080), (1024, 768))},
        "tiny_vl_tokens": {f"{w}x{h}": _tokens(m.image_processor, (w, h)) for w, h in ((1280, 800), (1920, 1080), (1024, 768))},
        "repeats": repeats,
    }
    for k, v in out.items():
        print(f"{k}: {v}")
    return out


if __name__ == "__main__":
    run(quick="--quick" in sys.argv)
