"""Shared by the vision-language tests: coloured-square pictures, their prompts through the tiny VLM's processor,
and the embedded engine serving it."""

from __future__ import annotations

import io
from contextlib import contextmanager
from pathlib import Path

from openforge.engine.vision import expand_image_tokens


RED, GREEN, BLUE = (220, 30, 30), (30, 200, 40), (30, 40, 220)


def _png(color: tuple[int, int, int], size: tuple[int, int], box: tuple[float, float, float, float] = (.25, .25, .75, .75)
         ) -> bytes:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", size, (255, 255, 255))
    w, h = size
    ImageDraw.Draw(img).rectangle([int(box[0] * w), int(box[1] * h), int(box[2] * w), int(box[3] * h)], fill=color)
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def _prompt(proc, images: list[bytes], text: str = "What colour is the square?") -> list[int]:
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    rendered = proc.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                        tokenize=False)
    return expand_image_tokens(proc.tokenizer.encode(rendered), images, proc)


@contextmanager
def embedded_engine(model_dir: Path):
    """The real embedded engine on loopback (fp32, CPU, seeded) and a client for it."""
    from openforge.engine.client import EngineClient
    from openforge.engine.embedded import create_engine_app
    from openforge.engine.serve import serve_in_thread
    from openforge.config import EmbeddedEngineConfig

    app = create_engine_app(EmbeddedEngineConfig(model=str(model_dir), dtype="float32", device="cpu", seed=0))
    with serve_in_thread(app) as server:
        yield EngineClient(server.url, timeout=60)
