"""Image rows under torchrun: what rank 0 ships each step, the image bytes (trainer/distributed.py
StepImages) or the pixel tensors, on 2 gloo ranks.

N distinct 1920x1080 screenshots (Chromium's rendering of a shop page when chromium is on PATH, else
a page drawn with PIL), Qwen2-VL's default image processor (the published max_pixels; the tiny VLM
caps its images far lower). Per way, median of 3 broadcasts from rank 0 (`broadcast_object_list`, what
Group.step uses):

    bytes      the encoded PNGs, each once; rank 1 then re-creates the pixel values of its share
               (half the images) with the processor: that time is added (the baseline pays it on rank 0)
    pixels     the fp32 pixel tensors rank 0 made (the baseline: nothing to re-create)

Ratio: bytes (broadcast + rank 1's processing) / pixels (broadcast). Both on one machine's loopback:
across nodes the byte count matters more than here.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _page(path: Path) -> bytes | None:
    """A real Chromium screenshot of a shop-like page, or None without chromium."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        return None
    html = "<html><body style='font-family:sans-serif'><h1>Shop</h1>" + "".join(
        f"<div style='display:inline-block;width:280px;margin:10px;padding:10px;border:1px solid #ccc'>"
        f"<h3>Item {i}</h3><p>Price: ${i * 3 + 7}.99</p><button>Add to cart</button>"
        f"<div style='width:200px;height:120px;background:linear-gradient(90deg,#{(i * 37) % 255:02x}3060,"
        f"#20{(i * 91) % 255:02x}c0)'></div></div>" for i in range(24)) + "</body></html>"
    (path / "page.html").write_text(html)
    out = path / "shot.png"
    subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1920,1080",
                    f"--screenshot={out}", f"file://{path / 'page.html'}"], capture_output=True, timeout=120)
    return out.read_bytes() if out.exists() else None


def screenshots(n: int, tmp: Path) -> tuple[list[bytes], str]:
    from PIL import Image, ImageDraw

    base = _page(tmp)
    source = "chromium"
    if base is None:
        source = "PIL"
        img = Image.new("RGB", (1920, 1080), "white")
        draw = ImageDraw.Draw(img)
        for i in range(24):
            x, y = 20 + (i % 6) * 310, 80 + (i // 6) * 240
            draw.rectangle([x, y, x + 290, y + 220], outline=(200, 200, 200))
            draw.text((x + 10, y + 10), f"Item {i}  ${i * 3 + 7}.99", fill=(0, 0, 0))
            draw.rectangle([x + 10, y + 60, x + 210, y + 180], fill=((i * 37) % 255, 48, 96))
    else:
        img = Image.open(io.BytesIO(base)).convert("RGB")
    out = []
    for k in range(n):  # distinct images: a different counter drawn on each
        im = img.copy()
        ImageDraw.Draw(im).text((1800, 10), f"#{k}", fill=(0, 0, 0))
        buf = io.BytesIO()
        im.save(buf, "PNG")
        out.append(buf.getvalue())
    return out, source


def worker(n: int, tmp: str, out: str) -> None:
    import torch.distributed as dist
    from transformers import Qwen2VLImageProcessorPil

    from openforge.engine.vision import pixel_inputs
    from openforge.trainer import distributed

    d = distributed.init()
    proc = Qwen2VLImageProcessorPil()
    shots, source = screenshots(n, Path(tmp)) if d.is_main else (None, None)
    pixels = [pixel_inputs([s], proc)[0] for s in shots] if d.is_main else None
    result: dict = {}
    for name, payload in (("bytes", shots), ("pixels", pixels)):
        times = []
        for _ in range(3):
            dist.barrier()
            t0 = time.perf_counter()
            got = distributed.broadcast(payload, d)
            times.append(time.perf_counter() - t0)
        if name == "bytes" and d.rank == 1:  # rank 1 re-creates its share's pixels
            t0 = time.perf_counter()
            for s in got[: n // 2]:
                pixel_inputs([s], proc)
            result["t_process_share_s"] = time.perf_counter() - t0
        result[f"t_broadcast_{name}_s"] = statistics.median(times)
        result[f"{name}_mb"] = len(pickle.dumps(got)) / 1e6
    gathered = [None, None]
    dist.all_gather_object(gathered, result)
    if d.is_main:
        merged = {**gathered[1], **gathered[0], "t_process_share_s": gathered[1]["t_process_share_s"],
                  "t_broadcast_bytes_s": max(g["t_broadcast_bytes_s"] for g in gathered),
                  "t_broadcast_pixels_s": max(g["t_broadcast_pixels_s"] for g in gathered), "source": source,
                  "n_images": n, "grid": pixel_inputs([shots[0]], proc)[1].tolist()[0]}
        Path(out).write_text(json.dumps(merged))
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(quick: bool = False) -> dict:
    n = 4 if quick else 16
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                               "127.0.0.1", "--master_port", str(_free_port()), "-m", "bench.vl_dist", "worker", str(n), tmp, str(out)],
                              env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-3000:])
        r = json.loads(out.read_text())
    bytes_total = r["t_broadcast_bytes_s"] + r["t_process_share_s"]
    r["ratio_bytes_vs_pixels"] = bytes_total / r["t_broadcast_pixels_s"]
    print(f"{n} screenshots ({r['source']}, grid {r['grid']}): ship bytes {r['bytes_mb']:.1f} MB in "
          f"{r['t_broadcast_bytes_s'] * 1e3:.0f} ms + rank 1 re-creates its {n // 2} in {r['t_process_share_s'] * 1e3:.0f} ms; "
          f"ship pixels {r['pixels_mb']:.0f} MB in {r['t_broadcast_pixels_s'] * 1e3:.0f} ms; "
          f"ratio {r['ratio_bytes_vs_pixels']:.2f}x")
    return r


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        worker(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    else:
        print(json.dumps(run("--quick" in sys.argv), indent=1))
