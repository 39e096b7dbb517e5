"""The proxy's overhead: latency it adds per call, throughput, and streaming time to first chunk.

Three paths to the same instant fake engine (SGLang's /generate answering a fixed 12-token
completion at once), all over loopback uvicorn, measured in one run:

    direct        client -> engine /generate                       (the floor)
    passthrough   client -> bare ASGI proxy -> engine /generate   (what any HTTP hop costs)
    forge         client -> forge proxy /v1/chat/completions -> engine
                  (auth, chat template + tokenising, tool-call parsing, two committed SQLite writes)

Each server runs in its own process (as in production: the engine, the proxy and the harness are
separate processes), so the client's timing loop never competes with a server for the GIL.
Figures are medians over repeats; ratios are against `direct` and `passthrough` of the same run.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from bench.timing import percentile
from engine.serve import serve_in_thread
from openforge.config import ProxyConfig
from openforge.store import Store
from proxy.server import ProxyServer

ANSWER = "The answer is 42, as the file says."
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
MESSAGES = [{"role": "system", "content": "You are a careful coding agent. " * 8},
            {"role": "user", "content": "Count the lines of data.txt and report the number."}]


def instant_engine(output_ids: list[int]) -> Starlette:
    """SGLang's /generate answering `output_ids` immediately (cumulative chunks when streaming)."""

    def chunk(n: int, prompt_len: int, done: bool) -> dict[str, Any]:
        meta = {"id": "x", "prompt_tokens": prompt_len, "completion_tokens": n,
                "finish_reason": {"type": "stop", "matched": output_ids[-1]} if done else None,
                "output_token_logprobs": [[-0.5, t, None] for t in output_ids[:n]]}
        return {"text": "", "output_ids": output_ids[:n], "meta_info": meta}

    async def generate(request: Request) -> Response:
        body = json.loads(await request.body())
        prompt_len = len(body.get("input_ids") or [])
        if not body.get("stream"):
            return JSONResponse(chunk(len(output_ids), prompt_len, True))

        async def events():
            for n in range(1, len(output_ids) + 1):
                yield f"data: {json.dumps(chunk(n, prompt_len, n == len(output_ids)))}\n\n"
            yield "data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    return Starlette(routes=[Route("/generate", generate, methods=["POST"]), Route("/health", health)])


def passthrough_proxy(upstream: str) -> Starlette:
    """A bare ASGI reverse proxy: bytes in, bytes out, nothing parsed or recorded."""
    client = httpx.AsyncClient(base_url=upstream, timeout=30)

    async def forward(request: Request) -> Response:
        req = client.build_request("POST", "/generate", content=await request.body(),
                                   headers={"content-type": "application/json"})
        resp = await client.send(req, stream=True)

        async def body():
            try:
                async for part in resp.aiter_raw():
                    yield part
            finally:
                await resp.aclose()
        return StreamingResponse(body(), status_code=resp.status_code,
                                 media_type=resp.headers.get("content-type"))

    return Starlette(routes=[Route("/generate", forward, methods=["POST"])])


def _serve_child(kind: str, arg: Any, urls: Any, stop: Any) -> None:
    if kind == "engine":
        handle: Any = serve_in_thread(instant_engine(arg))
    elif kind == "passthrough":
        handle = serve_in_thread(passthrough_proxy(arg))
    else:
        store_path, engine_url, model_dir = arg
        handle = ProxyServer(ProxyConfig(), store_path=store_path, engine_url=engine_url, model_path=model_dir).start()
    urls.put(handle.url)
    stop.wait()
    handle.stop()


class _Server:
    """A server of `kind` in a child process (spawned: no threads are forked)."""

    def __init__(self, kind: str, arg: Any) -> None:
        ctx = mp.get_context("spawn")
        self.stop_event = ctx.Event()
        urls = ctx.Queue()
        self.proc = ctx.Process(target=_serve_child, args=(kind, arg, urls, self.stop_event), daemon=True)
        self.proc.start()
        self.url = urls.get(timeout=120)

    def close(self) -> None:
        self.stop_event.set()
        self.proc.join(15)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5)


async def _latencies(url: str, path: str, body: dict, n: int, headers: dict) -> list[float]:
    out = []
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
        for _ in range(3):  # warm the connection and caches
            (await http.post(path, json=body)).raise_for_status()
        for _ in range(n):
            t = time.perf_counter()
            (await http.post(path, json=body)).raise_for_status()
            out.append((time.perf_counter() - t) * 1000)
    return out


async def _throughput(url: str, path: str, body: dict, n: int, concurrency: int, headers: dict) -> float:
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60,
                                 limits=httpx.Limits(max_connections=concurrency)) as http:
        remaining = [n]

        async def worker() -> None:
            while remaining[0] > 0:
                remaining[0] -= 1
                (await http.post(path, json=body)).raise_for_status()
        t = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return n / (time.perf_counter() - t)


async def _first_chunk(url: str, path: str, body: dict, n: int, headers: dict) -> list[float]:
    out = []
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
        for i in range(n + 3):
            t = time.perf_counter()
            async with http.stream("POST", path, json=body) as resp:
                first = None
                async for line in resp.aiter_lines():
                    if first is None and line.startswith("data:"):
                        first = (time.perf_counter() - t) * 1000
            if i >= 3:
                out.append(first or 0.0)
    return out


def run(quick: bool = False) -> dict:
    from engine.tiny import build_tokenizer

    n, n_tp, conc, repeats = (60, 120, 16, 1) if quick else (300, 600, 32, 3)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "tok"
        tok = build_tokenizer()
        tok.save_pretrained(model_dir)
        output_ids = tok.encode(ANSWER, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
        prompt_ids = tok.encode(tok.apply_chat_template(MESSAGES, tools=TOOLS, tokenize=False,
                                                        add_generation_prompt=True), add_special_tokens=False)
        store = Store(Path(tmp) / "forge.db")
        rollout = store.create_rollout(run_id=store.create_run(kind="bench").id, task_id="t", status="running")
        gen = {"input_ids": prompt_ids, "sampling_params": {"max_new_tokens": 64}, "return_logprob": True}
        chat = {"model": "m", "messages": MESSAGES, "tools": TOOLS}
        auth = {"authorization": f"Bearer {rollout.key}"}
        engine = _Server("engine", output_ids)
        passthrough = _Server("passthrough", engine.url)
        proxy = _Server("forge", (store.path, engine.url, model_dir))
        paths = {"direct": (engine.url, "/generate", gen, {}), "passthrough": (passthrough.url, "/generate", gen, {}),
                 "forge": (proxy.url, "/v1/chat/completions", chat, auth)}
        runs: dict[str, dict[str, list[float]]] = {k: {"p50": [], "p99": [], "rps": [], "ttfc": []} for k in paths}
        try:
            for _ in range(repeats):
                for name, (url, path, body, hdr) in paths.items():
                    lat = asyncio.run(_latencies(url, path, body, n, hdr))
                    runs[name]["p50"].append(percentile(lat, 0.5))
                    runs[name]["p99"].append(percentile(lat, 0.99))
                    runs[name]["rps"].append(asyncio.run(_throughput(url, path, body, n_tp, conc, hdr)))
                    ttfc = asyncio.run(_first_chunk(url, path, {**body, "stream": True}, max(n // 3, 10), hdr))
                    runs[name]["ttfc"].append(statistics.median(ttfc))
        finally:
            for server in (proxy, passthrough, engine):
                server.close()
            store.close()
    med = {k: {m: statistics.median(v) for m, v in d.items()} for k, d in runs.items()}
    f, d, p = med["forge"], med["direct"], med["passthrough"]
    result = {
        "prompt_tokens": len(prompt_ids), "completion_tokens": len(output_ids), "concurrency": conc,
        "latency_ms": med,
        "forge_added_p50_ms": f["p50"] - d["p50"], "forge_added_p99_ms": f["p99"] - d["p99"],
        "passthrough_added_p50_ms": p["p50"] - d["p50"],
        "forge_vs_passthrough_added_p50_ms": f["p50"] - p["p50"],
        "ttfc_added_ms": f["ttfc"] - d["ttfc"],
        "ratio_p50_vs_direct": f["p50"] / d["p50"], "ratio_p50_vs_passthrough": f["p50"] / p["p50"],
        "ratio_rps_vs_direct": f["rps"] / d["rps"], "ratio_rps_vs_passthrough": f["rps"] / p["rps"],
        "ratio_ttfc_vs_direct": f["ttfc"] / d["ttfc"],
    }
    _report(result, med)
    return result


def _report(result: dict, med: dict) -> None:
    print(f"proxy bench: prompt {result['prompt_tokens']} tokens, completion {result['completion_tokens']}, "
          "instant engine, loopback, each server in its own process")
    print(f"{'path':<12} {'p50 ms':>8} {'p99 ms':>8} {'req/s @' + str(result['concurrency']):>10} {'ttfc ms':>8}")
    for name, m in med.items():
        print(f"{name:<12} {m['p50']:8.2f} {m['p99']:8.2f} {m['rps']:10.0f} {m['ttfc']:8.2f}")
    print(f"forge adds {result['forge_added_p50_ms']:.2f} ms p50 / {result['forge_added_p99_ms']:.2f} ms p99 over "
          f"direct ({result['forge_vs_passthrough_added_p50_ms']:.2f} ms over a bare pass-through hop); "
          f"p50 ratio x{result['ratio_p50_vs_direct']:.2f} vs direct, x{result['ratio_p50_vs_passthrough']:.2f} vs "
          f"pass-through; throughput x{result['ratio_rps_vs_direct']:.2f} vs direct, "
          f"x{result['ratio_rps_vs_passthrough']:.2f} vs pass-through; first chunk +{result['ttfc_added_ms']:.2f} ms "
          f"(x{result['ratio_ttfc_vs_direct']:.2f})")


if __name__ == "__main__":
    run(quick=True)
