"""What a judge costs a GUI rollout (rollouts/tasks/judge.py): calls, prompt tokens, wall time, share.

The same builtin-web rollout (gui-colour-click-red by mini-gui: click, then done; two screenshots)
through RolloutRunner -> a bubblewrap sandbox with its display and chromium -> the real proxy -> a
scripted engine on the tiny Qwen2-VL, graded by the site's state alone (the baseline) and with a
WebVoyager judge shown the last 3 screenshots, answered by a scripted judge on 127.0.0.1 that replies
at once. Rounds alternate (load falls on both alike); figures are medians, one rollout at a time.
The judge's own think time is left out (a scripted judge answers in well under a millisecond): what
is measured is what forge adds per judged rollout (reading the screenshots, the prompt, the HTTP call,
the record), and its prompt's size in tokens as a Qwen2-VL judge would read it (text tokens of the
tiny model's tokenizer, which is Qwen2's; the image tokens of each screenshot by the tiny model's
processor, which shrinks images, and by a full-size Qwen2-VL's default resize), from which a real
judge's cost follows: one call per judged rollout, those tokens in, a verdict out.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class _Judge(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        data = json.dumps({"id": "j", "object": "chat.completion", "model": body["model"], "choices": [
            {"index": 0, "finish_reason": "stop",
             "message": {"role": "assistant", "content": "The red button was pressed.\nSUCCESS"}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def _qwen2_vl_image_tokens(width: int, height: int) -> int:
    """The tokens a full-size Qwen2-VL's default processor makes of one image: its `smart_resize` to
    multiples of 28 (14-pixel patches merged 2x2) within 56*56 .. 28*28*1280 pixels, one token per cell."""
    factor, lo, hi = 28, 56 * 56, 28 * 28 * 1280
    h, w = max(factor, round(height / factor) * factor), max(factor, round(width / factor) * factor)
    if h * w > hi:
        beta = math.sqrt(height * width / hi)
        h, w = math.floor(height / beta / factor) * factor, math.floor(width / beta / factor) * factor
    elif h * w < lo:
        beta = math.sqrt(lo / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return (h // factor) * (w // factor)


def _prompt_tokens(row: Any, processor: Any, images: Any) -> tuple[int, int, int, int]:
    """(text tokens, image tokens for the tiny model's processor, for a full-size Qwen2-VL's, image
    bytes) of a recorded judge prompt."""
    from openforge.engine.vision import VisionTokens, image_token_counts, open_image, pixel_inputs

    texts, shots = [], []
    for message in row.prompt_json:
        content = message["content"]
        for part in content if isinstance(content, list) else [{"type": "text", "text": content}]:
            if part["type"] == "image_url":
                shots.append(images.get(part["image_url"]["url"].split(":", 1)[1]))
            else:
                texts.append(part["text"])
    text_tokens = len(processor.tokenizer("\n".join(texts))["input_ids"])
    _, grid = pixel_inputs(shots, processor)
    merge = VisionTokens.from_processor(processor).merge_size
    full = sum(_qwen2_vl_image_tokens(*open_image(s).size) for s in shots)
    return text_tokens, sum(image_token_counts(grid, merge)), full, sum(len(s) for s in shots)


def run(quick: bool = False) -> dict:
    from openforge.config import ForgeConfig, HarnessConfig, JudgeConfig
    from openforge.engine.scripted import ScriptedEngine
    from openforge.engine.serve import serve_in_thread
    from openforge.engine.tiny_vl import build_tiny_vl_model
    from openforge.engine.vision import load_processor
    from openforge.image_store import ImageStore
    from openforge.paths import store_home
    from openforge.proxy.server import ProxyServer
    from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
    from openforge.rollouts.tasks.format import load_tasks
    from openforge.rollouts.tasks.judge import JudgeSpec
    from openforge.sandbox.testing import proxy_socket_path
    from openforge.store import Store

    rounds = 2 if quick else 5
    tmp = Path(tempfile.mkdtemp(prefix="forge-bench-judge-"))
    model = build_tiny_vl_model(tmp / "tiny-vl")
    processor = load_processor(model)
    store = Store(tmp / "forge.db")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Judge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    task = next(t for t in load_tasks("builtin-web") if t.id == "gui-colour-click-red")
    judged_task = task.model_copy(update={"judge": JudgeSpec(name="webvoyager", screenshots=3)})
    cfg = ForgeConfig()
    cfg.harness = HarnessConfig(name="mini-gui", max_turns=3, max_tokens=8,
                                extra_args=["--grid", "2x2", "--no-tools", "--max-side", "512"])
    cfg.proxy.max_context_tokens = 65536
    cfg.runner.time_limit_scale = 5.0
    cfg.judge = JudgeConfig(url=f"http://127.0.0.1:{server.server_address[1]}/v1", model="webvoyager-scripted")
    walls: dict[str, list[float]] = {"site state only": [], "site state + WebVoyager judge": []}
    judged: list[Any] = []
    try:
        for _ in range(rounds):
            for name, spec_task in (("site state only", task), ("site state + WebVoyager judge", judged_task)):
                engine = ScriptedEngine(model, ["click(0)", "done()"])
                with serve_in_thread(engine.app) as eng, ProxyServer(cfg.proxy, store_path=store.path, engine_url=eng.url,
                                                                      model_path=model, uds=proxy_socket_path()) as proxy:
                    run = store.create_run(kind="eval")
                    runner = RolloutRunner(store, config=cfg, proxy_url=proxy.url, proxy_socket=proxy.uds)
                    t0 = time.perf_counter()
                    [ro] = asyncio.run(runner.run(run.id, [RolloutSpec(spec_task)]))
                    walls[name].append(time.perf_counter() - t0)
                assert (ro.status, ro.reward) == ("scored", 1.0), (ro.status, ro.error, ro.stderr)
                if spec_task.judge is not None:
                    judged.append(ro)
    finally:
        server.shutdown()
    rows = [row for ro in judged for row in store.list_judgements(rollout_id=ro.id)]
    assert len(rows) == len(judged) and all(r.score == 1.0 for r in rows)
    text_tokens, image_tokens, full_image_tokens, image_bytes = _prompt_tokens(rows[-1], processor,
                                                            ImageStore.for_run(store_home(store.path), rows[-1].run_id))
    base = statistics.median(walls["site state only"])
    with_judge = statistics.median(walls["site state + WebVoyager judge"])
    judge_ms = statistics.median(r.latency_ms for r in rows)
    shots = sum(1 for p in rows[-1].prompt_json[1]["content"] if p["type"] == "image_url")
    out = {
        "rounds": rounds,
        "judge_calls_per_rollout": len(rows) / len(judged),
        "screenshots_shown": shots,
        "prompt_text_tokens": text_tokens,
        "prompt_image_tokens_tiny_vl": image_tokens,
        "prompt_image_tokens_qwen2_vl": full_image_tokens,
        "prompt_image_bytes": image_bytes,
        "judge_call_ms_median": round(judge_ms, 2),
        "rollout_s_median_site_only": round(base, 3),
        "rollout_s_median_with_judge": round(with_judge, 3),
        "judge_share_of_rollout_wall": round(judge_ms / 1000 / with_judge, 5),
        "rollout_ratio_with_judge": round(with_judge / base, 3),
    }
    for key, value in out.items():
        print(f"{key:34s} {value}")
    return out


if __name__ == "__main__":
    run()
