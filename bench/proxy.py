"""The proxy's overhead: latency it adds per call, its CPU per call, throughput, and streaming time to
first chunk, against a pass-through hop and (optionally) an earlier revision and the LiteLLM proxy.

Every system sits in front of an instant fake engine of its own API (SGLang's /generate for forge,
OpenAI's /v1/chat/completions for LiteLLM), each server in its own process, all on loopback:

    direct        client -> engine /generate                       (the floor)
    passthrough   client -> bare ASGI proxy -> engine /generate   (what any HTTP hop costs)
    forge         client -> forge proxy /v1/chat/completions -> engine
                  (auth, chat template + tokenising, tool-call parsing, the call recorded: both rows)
    forge@REV     the same, from the git revision REV (`FORGE_BENCH_BASELINE=REV`; asyncio + h11 as then)
    litellm       client -> `litellm` proxy (its own venv, `FORGE_BENCH_LITELLM=path/to/litellm`) -> engine
    forge-wN      forge with N worker processes behind one port (req/s at c=32 only)

Rounds are interleaved (each round measures every system once, in turn), so a machine whose load
drifts hurts all of them alike; figures are medians over rounds. Per system and round:

    c=1    p50/p99 latency of sequential calls on one kept-alive connection
    c=1    also the server's CPU per call (psutil: user + system of the server process and its
           children, over the phase)
    c=32   req/s with 32 concurrent clients (for forge: 32 rollouts, one call at a time each), and
           the server's CPU per call
    ttfc   time to the first SSE data line of a streamed call, sequential
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.timing import percentile

ANSWER = "The answer is 42, as the file says."
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
MESSAGES = [{"role": "system", "content": "You are a careful coding agent. " * 8},
            {"role": "user", "content": "Count the lines of data.txt and report the number."}]
REPO = Path(__file__).resolve().parent.parent


# -- the servers (each runs as `python -m bench.proxy serve KIND JSON-ARGS` in its own process) ---------

def instant_engine(output_ids: list[int], answer: str = ANSWER) -> Any:
    """SGLang's /generate answering `output_ids` at once (cumulative chunks when streaming), and an
    OpenAI /v1/chat/completions answering `answer` (the backend LiteLLM's proxy is put in front of)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

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

    async def chat(request: Request) -> Response:
        body = json.loads(await request.body())
        base = {"id": "chatcmpl-x", "created": 0, "model": body.get("model", "m")}
        usage = {"prompt_tokens": 100, "completion_tokens": len(output_ids), "total_tokens": 100 + len(output_ids)}
        if not body.get("stream"):
            return JSONResponse({**base, "object": "chat.completion", "usage": usage, "choices": [
                {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": answer}}]})

        async def events():
            words = answer.split(" ")
            for i, word in enumerate(words):
                delta = {"role": "assistant", "content": word} if i == 0 else {"content": " " + word}
                yield "data: " + json.dumps({**base, "object": "chat.completion.chunk", "choices": [
                    {"index": 0, "delta": delta, "finish_reason": None}]}) + "\n\n"
            yield "data: " + json.dumps({**base, "object": "chat.completion.chunk", "usage": usage, "choices": [
                {"index": 0, "delta": {}, "finish_reason": "stop"}]}) + "\n\n"
            yield "data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    return Starlette(routes=[Route("/generate", generate, methods=["POST"]),
                             Route("/v1/chat/completions", chat, methods=["POST"]), Route("/health", health)])


def passthrough_proxy(upstream: str) -> Any:
    """A bare ASGI reverse proxy: bytes in, bytes out, nothing parsed or recorded."""
    import httpx
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

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


# Runs a forge proxy with only the API every revision has (ProxyServer(config, store_path=...,
# engine_url=..., model_path=...)), so the same code serves this tree and an older one.
_FORGE_CHILD = """
import json, sys
args = json.loads(sys.argv[1])
if args.pop("no_uvloop", False):
    sys.modules["uvloop"] = None  # as the revision ran before uvloop was a dependency
from openforge.config import ProxyConfig
from proxy.server import ProxyServer
cfg = ProxyConfig(**args.pop("config"))
server = ProxyServer(cfg, **args).start()
print(server.url, flush=True)
sys.stdin.read()
server.stop()
"""


def _serve(kind: str, args: dict[str, Any]) -> None:
    from engine.serve import serve_in_thread

    app = instant_engine(args["output_ids"]) if kind == "engine" else passthrough_proxy(args["upstream"])
    handle = serve_in_thread(app)
    print(handle.url, flush=True)
    sys.stdin.read()  # until the bench closes our stdin
    handle.stop()


class _Server:
    """A server in a child process: it prints its URL, and stops when its stdin closes."""

    def __init__(self, argv: list[str], *, cwd: Path = REPO, env: dict[str, str] | None = None,
                 url: str | None = None, ready_timeout: float = 180) -> None:
        self.proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        if url is None:
            line = self.proc.stdout.readline().strip()  # type: ignore[union-attr]
            if not line.startswith("http"):
                self.close()
                raise RuntimeError(f"{argv[:3]} did not start (printed {line!r})")
            url = line
        self.url = url
        if url is not None:
            self._wait_ready(ready_timeout)

    def _wait_ready(self, timeout: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server for {self.url} exited with {self.proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2).status_code < 500:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"server at {self.url} not ready after {timeout:g}s")

    def cpu_s(self) -> float:
        import psutil

        try:
            root = psutil.Process(self.proc.pid)
            total = 0.0
            for p in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    t = p.cpu_times()
                    total += t.user + t.system
            return total
        except psutil.Error:
            return float("nan")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # type: ignore[union-attr]
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait(10)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _forge(tree: Path, store: Path, engine_url: str, model_dir: Path, *, workers: int = 1,
           baseline: bool = False) -> _Server:
    config: dict[str, Any] = {"max_concurrent_calls": 256}
    if workers > 1:
        config.update(workers=workers, port=_free_port())
    args = {"store_path": str(store), "engine_url": engine_url, "model_path": str(model_dir), "config": config,
            "no_uvloop": baseline}
    return _Server([sys.executable, "-c", _FORGE_CHILD, json.dumps(args)], cwd=tree,
                   env={"PYTHONPATH": str(tree)})


def _litellm(exe: str, backend: str, tmp: Path) -> _Server:
    cfg = tmp / "litellm.yaml"
    cfg.write_text("model_list:\n  - model_name: m\n    litellm_params:\n      model: openai/m\n"
                   f"      api_base: {backend}/v1\n      api_key: none\n"
                   "litellm_settings:\n  drop_params: true\n  telemetry: false\n"
                   # No master key (no auth, no key database): the lightest LiteLLM proxy there is.
                   "general_settings:\n  dangerously_permit_weak_or_unset_master_key: true\n")
    port = _free_port()
    return _Server([exe, "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"],
                   url=f"http://127.0.0.1:{port}", env={"LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False"})


# -- the load ----------------------------------------------------------------------------------

async def _latencies(url: str, path: str, body: dict, n: int, headers: dict) -> list[float]:
    import aiohttp

    out = []
    async with aiohttp.ClientSession(base_url=url, headers=headers) as http:
        for i in range(n + 3):  # the first 3 warm the connection and caches
            t = time.perf_counter()
            async with http.post(path, json=body) as resp:
                resp.raise_for_status()
                await resp.read()
            if i >= 3:
                out.append((time.perf_counter() - t) * 1000)
    return out


async def _throughput(url: str, path: str, body: dict, n: int, headers: list[dict],
                      server: _Server, refused: list[int] | None = None) -> tuple[float, float, float]:
    """(req/s, server CPU ms per call, p50 ms) of `n` calls from one client per entry of `headers`
    (for forge, each its own rollout: concurrent rollouts, each one harness making one call at a time).

    With `refused` (a one-item counter), a 429 is retried after its Retry-After, as harnesses do (Claude
    Code, Codex and the OpenAI/Anthropic SDKs all retry 429): the latency then includes the wait."""
    import aiohttp

    conn = aiohttp.TCPConnector(limit=len(headers))
    async with aiohttp.ClientSession(base_url=url, connector=conn) as http:
        async def call(hdr: dict) -> float:
            t = time.perf_counter()
            while True:
                async with http.post(path, json=body, headers=hdr) as resp:
                    if resp.status == 429 and refused is not None:
                        refused[0] += 1
                        await resp.read()
                        await asyncio.sleep(float(resp.headers.get("retry-after", "1")))
                        continue
                    resp.raise_for_status()
                    await resp.read()
                return (time.perf_counter() - t) * 1000

        await asyncio.gather(*(call(h) for h in headers))  # open the connections
        remaining = [n]
        lat: list[float] = []

        async def worker(hdr: dict) -> None:
            while remaining[0] > 0:
                remaining[0] -= 1
                lat.append(await call(hdr))
        cpu0 = server.cpu_s()
        t = time.perf_counter()
        await asyncio.gather(*(worker(h) for h in headers))
        elapsed = time.perf_counter() - t
        cpu = server.cpu_s() - cpu0
    return n / elapsed, cpu * 1000 / n, statistics.median(lat)


async def _first_chunk(url: str, path: str, body: dict, n: int, headers: dict) -> list[float]:
    import aiohttp

    out = []
    async with aiohttp.ClientSession(base_url=url, headers=headers) as http:
        for i in range(n + 3):
            t = time.perf_counter()
            first = None
            async with http.post(path, json=body) as resp:
                resp.raise_for_status()
                async for line in resp.content:
                    if first is None and line.startswith(b"data:"):
                        first = (time.perf_counter() - t) * 1000
            if i >= 3:
                out.append(first or 0.0)
    return out


def _baseline_tree(rev: str, tmp: Path) -> Path:
    """The files of revision `rev` in a folder (git archive: the working tree is not touched)."""
    tree = tmp / f"rev-{rev}"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def run(quick: bool = False) -> dict:
    from engine.tiny import build_tokenizer
    from openforge.store import Store

    n, n_tp, conc, rounds = (60, 200, 32, 1) if quick else (300, 1000, 32, 3)
    baseline_rev = os.environ.get("FORGE_BENCH_BASELINE")
    litellm_exe = os.environ.get("FORGE_BENCH_LITELLM") or shutil.which("litellm")
    worker_counts = [int(w) for w in os.environ.get("FORGE_BENCH_WORKERS", "2").split(",") if w.strip()]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model_dir = tmp / "tok"
        tok = build_tokenizer()
        tok.save_pretrained(model_dir)
        output_ids = tok.encode(ANSWER, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
        prompt_ids = tok.encode(tok.apply_chat_template(MESSAGES, tools=TOOLS, tokenize=False,
                                                        add_generation_prompt=True), add_special_tokens=False)
        store = Store(tmp / "forge.db")
        run_id = store.create_run(kind="bench").id
        keys: dict[str, list[str]] = {}
        gen = {"input_ids": prompt_ids, "sampling_params": {"max_new_tokens": 64}, "return_logprob": True}
        chat = {"model": "m", "messages": MESSAGES, "tools": TOOLS}

        def auth(name: str) -> list[dict[str, str]]:  # `conc` rollouts (and keys) per system
            if name not in keys:
                keys[name] = [store.create_rollout(run_id=run_id, task_id=name, status="running").key
                              for _ in range(conc)]
            return [{"authorization": f"Bearer {key}"} for key in keys[name]]

        me = [sys.executable, "-m", "bench.proxy", "serve"]
        servers: dict[str, _Server] = {}
        try:
            engine = servers["engine"] = _Server([*me, "engine", json.dumps({"output_ids": output_ids})])
            servers["passthrough"] = _Server([*me, "passthrough", json.dumps({"upstream": engine.url})])
            servers["forge"] = _forge(REPO, store.path, engine.url, model_dir)
            if baseline_rev:
                servers[f"forge@{baseline_rev}"] = _forge(_baseline_tree(baseline_rev, tmp), store.path, engine.url,
                                                          model_dir, baseline=True)
            if litellm_exe:
                try:
                    servers["litellm"] = _litellm(litellm_exe, engine.url, tmp)
                except RuntimeError as exc:
                    print(f"litellm: not measured ({exc})")
            for w in worker_counts:
                if w > 1:
                    servers[f"forge-w{w}"] = _forge(REPO, store.path, engine.url, model_dir, workers=w)
            paths: dict[str, tuple[_Server, str, dict, list[dict]]] = {}
            for name, server in servers.items():
                if name in ("engine", "passthrough"):
                    paths["direct" if name == "engine" else name] = (server, "/generate", gen, [{}] * conc)
                elif name == "litellm":
                    paths[name] = (server, "/v1/chat/completions", chat, [{}] * conc)
                else:
                    paths[name] = (server, "/v1/chat/completions", chat, auth(name))
            made = dict.fromkeys(paths, 0)
            runs = {k: {"p50": [], "p99": [], "rps": [], "cpu_ms": [], "cpu_ms_c1": [], "p50_c32": [],
                         "ttfc": []} for k in paths}
            for _ in range(rounds):
                for name, (server, path, body, hdr) in paths.items():
                    m = runs[name]
                    if not name.startswith("forge-w"):  # many workers: throughput is their point
                        cpu0 = server.cpu_s()
                        lat = asyncio.run(_latencies(server.url, path, body, n, hdr[0]))
                        m["cpu_ms_c1"].append((server.cpu_s() - cpu0) * 1000 / (n + 3))
                        m["p50"].append(percentile(lat, 0.5))
                        m["p99"].append(percentile(lat, 0.99))
                        ttfc = asyncio.run(_first_chunk(server.url, path, {**body, "stream": True},
                                                        max(n // 3, 10), hdr[0]))
                        m["ttfc"].append(statistics.median(ttfc))
                        made[name] += n + 3 + max(n // 3, 10) + 3
                    rps, cpu_ms, p50_c = asyncio.run(_throughput(server.url, path, body, n_tp, hdr, server))
                    m["rps"].append(rps)
                    m["cpu_ms"].append(cpu_ms)
                    m["p50_c32"].append(p50_c)
                    made[name] += conc + n_tp
            recorded = _check_recorded(store, keys, made)
        finally:
            for server in reversed(list(servers.values())):
                server.close()
            store.close()
    med = {k: {m: round(statistics.median(v), 3) for m, v in d.items() if v} for k, d in runs.items()}
    d = med["direct"]
    result: dict[str, Any] = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(output_ids),
                              "concurrency": conc, "rounds": rounds, "calls_c1": n, "calls_c32": n_tp,
                              "systems": med, "recorded_calls_checked": recorded}
    for name, m in med.items():
        if name == "direct" or name.startswith("forge-w"):  # many workers: req/s only (below)
            continue
        added = {"added_p50_ms": m.get("p50", float("nan")) - d["p50"], "added_ttfc_ms": m.get("ttfc", float("nan")) - d["ttfc"],
                 "rps_vs_direct": m["rps"] / d["rps"]}
        result[f"{name}_vs_direct"] = {k: round(v, 3) for k, v in added.items()}
    f = med["forge"]
    if baseline_rev:
        b = med[f"forge@{baseline_rev}"]
        result["forge_vs_baseline"] = {
            "added_p50_ratio": round((f["p50"] - d["p50"]) / (b["p50"] - d["p50"]), 3),
            "cpu_per_call_ratio": round(f["cpu_ms"] / b["cpu_ms"], 3),
            "cpu_per_call_c1_ratio": round(f["cpu_ms_c1"] / b["cpu_ms_c1"], 3),
            "rps_ratio": round(f["rps"] / b["rps"], 3),
            "added_ttfc_ratio": round((f["ttfc"] - d["ttfc"]) / (b["ttfc"] - d["ttfc"]), 3)}
    if "litellm" in med:
        lit = med["litellm"]
        result["forge_vs_litellm"] = {"added_p50_ratio": round((f["p50"] - d["p50"]) / (lit["p50"] - d["p50"]), 3),
                                      "cpu_per_call_ratio": round(f["cpu_ms"] / lit["cpu_ms"], 3),
                                      "rps_ratio": round(f["rps"] / lit["rps"], 3)}
    # One worker process is one core's worth of Python: at c=32 it serves about this many calls per
    # second of its own CPU; N workers on N spare cores, about N times it (until the one SQLite writer
    # or the engine is the limit).
    result["forge_calls_per_core_s"] = round(1000 / f["cpu_ms"], 1)
    for w in worker_counts:
        if f"forge-w{w}" in med:
            result[f"forge_w{w}_rps_vs_w1"] = round(med[f"forge-w{w}"]["rps"] / f["rps"], 3)
    _report(result, med)
    return result


def _check_recorded(store: Any, keys: dict[str, list[str]], made: dict[str, int]) -> int:
    """Every forge call the bench made is a finished row, numbered 0..n-1 in its rollout."""
    total = 0
    for name, system_keys in keys.items():
        rows = 0
        for key in system_keys:
            calls = sorted(store.list_calls(rollout_id=store.rollout_by_key(key).id), key=lambda c: c.seq)
            if [c.seq for c in calls] != list(range(len(calls))) or any(c.status != "ok" for c in calls):
                raise RuntimeError(f"{name}: recorded calls are not exact: statuses {sorted({c.status for c in calls})}")
            rows += len(calls)
        if rows != made[name]:
            raise RuntimeError(f"{name}: {rows} calls recorded for {made[name]} made")
        total += rows
    return total


def _report(result: dict, med: dict) -> None:
    print(f"proxy bench: prompt {result['prompt_tokens']} tokens, completion {result['completion_tokens']}, "
          f"instant engine, loopback, each server in its own process, {result['rounds']} interleaved round(s)")
    print(f"{'system':<16} {'p50 ms':>8} {'p99 ms':>8} {'ttfc ms':>8} {'cpu/call':>9} {'req/s@32':>9} {'p50@32':>8} "
          f"{'cpu/call@32':>11}")
    nan = float("nan")
    for name, m in med.items():
        print(f"{name:<16} {m.get('p50', nan):8.2f} {m.get('p99', nan):8.2f} {m.get('ttfc', nan):8.2f} "
              f"{m.get('cpu_ms_c1', nan):9.2f} {m['rps']:9.0f} {m['p50_c32']:8.2f} {m['cpu_ms']:11.2f}")
    for key, value in result.items():
        if key.endswith(("_vs_direct", "_vs_baseline", "_vs_litellm", "_vs_w1")) or key == "recorded_calls_checked":
            print(f"{key}: {value}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "serve":
        _serve(sys.argv[2], json.loads(sys.argv[3]))
    else:
        print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
