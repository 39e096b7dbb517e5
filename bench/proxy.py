"""The proxy's overhead: latency it adds per call, its CPU per call, throughput, and streaming time to
first chunk, against a pass-through hop and (optionally) an earlier revision, the LiteLLM proxy and Agent
Lightning's LLMProxy.

Every system sits in front of an instant fake engine of its own API (SGLang's /generate for forge,
OpenAI's /v1/chat/completions for LiteLLM and Agent Lightning), each server in its own process, all on loopback:

    direct        client -> engine /generate                       (the floor)
    passthrough   client -> bare ASGI proxy -> engine /generate   (what any HTTP hop costs: the fastest
                  forwarding this stack allows, uvicorn + httptools + one shared aiohttp session)
    forge         client -> forge proxy /v1/chat/completions -> engine
                  (auth, chat template + tokenising, tool-call parsing, the call recorded: both rows)
    forge@REV     the same, from the git revision REV (`FORGE_BENCH_BASELINE=REV`; on asyncio's loop if REV
                  had no uvloop)
    litellm       client -> `litellm` proxy (its own venv, `FORGE_BENCH_LITELLM=path/to/litellm`) -> engine
    agl           client -> Agent Lightning 0.3.0's LLMProxy, spans on, into its in-memory store (its own venv,
                  `FORGE_BENCH_AGL=path/to/python`) -> engine
    forge-wN      forge with N worker processes behind one port (req/s at c=32 only)

Rounds are interleaved (each round measures every system once, in turn), so a machine whose load
drifts hurts all of them alike; figures are medians over rounds. Per system and round:

    c=1    p50/p99 latency of sequential calls on one kept-alive connection
    c=1    also the server's CPU per call (psutil: user + system of the server process and its
           children, over the phase)
    c=32   req/s with 32 concurrent clients (for forge: 32 rollouts, one call at a time each), and
           the server's CPU per call
    ttfc   time to the first SSE data line of a streamed call, sequential

On a shared machine the latency each hop adds swings with the load: `forge_vs_passthrough` (forge
minus a bare pass-through hop, both measured in the same rounds) is the steadier figure. `stages_us`
times each stage of one forge call on its own, in the bench's process (see `_stages`).
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
    """The fastest pass-through this stack allows: a bare ASGI app (no framework, nothing parsed or
    recorded) that forwards bytes in and out through one shared aiohttp session, as the engine client
    does (aiohttp replaced httpx there as the faster client); served, like forge, by uvicorn with
    httptools on uvloop."""
    import aiohttp

    session: aiohttp.ClientSession | None = None

    async def app(scope: dict, receive: Any, send: Any) -> None:
        nonlocal session
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            if session is not None:
                await session.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if session is None:  # made on the server's own loop, which owns its connection pool
            session = aiohttp.ClientSession(upstream, auto_decompress=False, skip_auto_headers=("User-Agent",),
                                            connector=aiohttp.TCPConnector(limit=512))
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        async with session.post(scope["path"], data=body, headers={"content-type": "application/json"}) as resp:
            headers = [(b"content-type", resp.headers.get("content-type", "application/json").encode())]
            await send({"type": "http.response.start", "status": resp.status, "headers": headers})
            async for part in resp.content.iter_any():
                await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


# Runs a forge proxy with only the API every revision has (ProxyServer(config, store_path=...,
# engine_url=..., model_path=...)), so the same code serves this tree and an older one.
_FORGE_CHILD = """
import json, sys
args = json.loads(sys.argv[1])
if args.pop("no_uvloop", False):
    sys.modules["uvloop"] = None  # as the revision ran before uvloop was a dependency
from openforge.config import ProxyConfig
from openforge.proxy.server import ProxyServer
cfg = ProxyConfig(**args.pop("config"))
server = ProxyServer(cfg, **args).start()
print(server.url, flush=True)
sys.stdin.read()
server.stop()
"""


def _serve(kind: str, args: dict[str, Any]) -> None:
    from openforge.engine.serve import serve_in_thread

    app = instant_engine(args["output_ids"]) if kind == "engine" else passthrough_proxy(args["upstream"])
    handle = serve_in_thread(app, http="httptools")
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


# Agent Lightning's LLMProxy as its trainer runs it: LiteLLM's proxy app with agentlightning's middlewares
# (rollout/attempt routing with a span sequence id per call, streaming converted to a non-streamed
# call) and callbacks (return_token_ids, its OpenTelemetry exporter writing every call's spans into the
# store), over the trainer's default store, an in-memory one (thread-safe, as it is under the
# client/server strategy). Runs in the agentlightning venv (`FORGE_BENCH_AGL=path/to/python`); the URL it
# prints carries the /rollout/R/attempt/A prefix every traced call goes through. On exit it checks that
# every call made left spans in the store.
_AGL_CHILD = """
import asyncio, contextlib, json, logging, sys
args = json.loads(sys.argv[1])
out, sys.stdout = sys.stdout, sys.stderr  # only our URL goes to stdout
logging.disable(logging.WARNING)
from agentlightning import LLMProxy
from agentlightning.store import InMemoryLightningStore

async def main():
    store = InMemoryLightningStore(thread_safe=True)
    model = {"model_name": "m", "litellm_params": {"model": "openai/m", "api_base": args["backend"] + "/v1",
                                                     "api_key": "none"}}
    proxy = LLMProxy(port=args["port"], host="127.0.0.1", model_list=[model], store=store, launch_mode="thread",
                     litellm_config={"litellm_settings": {"drop_params": True},
                                     # no master key, as the LiteLLM row runs (and as agentlightning's own examples do)
                                     "general_settings": {"dangerously_permit_weak_or_unset_master_key": True}})
    await proxy.start()
    attempted = await store.start_rollout(input={"task": "bench"})
    rid, aid = attempted.rollout_id, attempted.attempt.attempt_id
    print(f"http://127.0.0.1:{args['port']}/rollout/{rid}/attempt/{aid}", file=out, flush=True)
    await asyncio.to_thread(sys.stdin.read)
    await asyncio.sleep(1)  # the exporter's last flush
    spans = await store.query_spans(rid, aid)
    print(json.dumps({"spans": len(spans), "traced_calls": len({s.sequence_id for s in spans})}), file=out, flush=True)
    with contextlib.suppress(Exception):
        await proxy.stop()

asyncio.run(main())
"""


def _agl(python: str, backend: str) -> _Server:
    port = _free_port()
    try:
        server = _Server([python, "-c", _AGL_CHILD, json.dumps({"backend": backend, "port": port})],
                         env={"LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False", "PYTHONPATH": ""})
    except (RuntimeError, OSError) as exc:  # its own error, if any, is above (the child's stderr is ours)
        raise RuntimeError(f"{python} did not start Agent Lightning's LLMProxy: "
                           f"{exc if isinstance(exc, OSError) else 'see its error above'}") from None
    origin = f"http://127.0.0.1:{port}"
    server.url, server.prefix = origin, server.url[len(origin):]  # the prefix goes on each call's path
    return server


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
    # A revision from before uvloop was a dependency ran on asyncio's loop: measured as it ran then.
    no_uvloop = baseline and "uvloop" not in (tree / "pyproject.toml").read_text()
    args = {"store_path": str(store), "engine_url": engine_url, "model_path": str(model_dir), "config": config,
            "no_uvloop": no_uvloop}
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


async def _stages(engine_url: str, store_path: Path, model_dir: Path, key: str, n: int) -> dict[str, float]:
    """Median microseconds of each stage of one forge call, timed one by one in this process on the
    bench's own request (the forge proxy's objects, the same store and instant engine). Uncached
    rendering and tokenising (what every call paid before proxy/promptcache.py) beside the memoised."""
    from openforge.engine.client import EngineClient
    from openforge.config import ProxyConfig
    from openforge.store import utcnow
    from openforge.proxy import openai_chat
    from openforge.proxy.app import create_app, parse_body
    from openforge.proxy.calls import Message
    from openforge.proxy.generation import Generation, GenerationParams
    from openforge.proxy.tokens import load_tokenizer
    from starlette.responses import JSONResponse

    def timed(fn: Any) -> float:
        ts = []
        for _ in range(n):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts) * 1e6

    async def atimed(fn: Any) -> float:
        ts = []
        for _ in range(n):
            t = time.perf_counter()
            await fn()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts) * 1e6

    engine = EngineClient(engine_url)
    app = create_app(ProxyConfig(), store_path=store_path, engine=engine, tokenizer=load_tokenizer(model_dir),
                     recover=False)
    proxy = app.state.proxy
    await proxy.ensure_started()
    try:
        raw = json.dumps({"model": "m", "messages": MESSAGES, "tools": TOOLS})
        rollout = await proxy.store.rollout_by_key(key)
        req = openai_chat.parse_request(parse_body(raw))
        renderer, builder = proxy.renderer, proxy.pipeline.prompts.builder
        tok = renderer.tokenizer
        dicts = [m.template_dict() for m in req.messages]
        text = renderer.render(req.messages, req.prompt_tools, generation=True)
        ids = renderer.encode(text)
        out: dict[str, float] = {}
        out["auth"] = await atimed(lambda: proxy.store.rollout_by_key(key))
        out["parse"] = timed(lambda: openai_chat.parse_request(parse_body(raw)))
        out["render_uncached"] = timed(lambda: tok.apply_chat_template(dicts, tools=req.prompt_tools, tokenize=False,
                                                                        add_generation_prompt=True))
        out["render"] = timed(lambda: renderer.render(req.messages, req.prompt_tools, generation=True))
        out["tokenise_uncached"] = timed(lambda: renderer.encode_batch([text]))
        out["tokenise"] = timed(lambda: renderer.encode(text))
        # A rollout's next call: the same system prompt and tools, a turn never seen (a miss for the
        # render memo, one new piece to tokenise).
        turn = iter(range(10**9))
        out["render_new_turn"] = timed(lambda: renderer.render(
            [*req.messages, Message("user", f"Turn {next(turn)}: the tests pass now.")], req.prompt_tools,
            generation=True))
        out["tokenise_new_turn"] = timed(lambda: renderer.encode(
            f"{text}<|im_start|>user\nTurn {next(turn)}: the tests pass now.<|im_end|>\n<|im_start|>assistant\n"))
        sampling = {"max_new_tokens": 64, "stop_token_ids": renderer.stop_token_ids, "temperature": 1.0,
                    "top_p": 1.0, "top_k": -1}
        out["engine_round_trip"] = await atimed(lambda: engine.generate(ids, sampling, rid="bench"))
        answer = await engine.generate(ids, sampling, rid="bench")

        def completion() -> Any:
            gen = Generation(engine, renderer, GenerationParams(
                ids, sampling, [], None, parser=proxy.pipeline.parsers.for_request(req, prompt_text=text)))
            gen.finish = answer.finish_reason
            gen._push(answer.output_ids, answer.logprobs)
            gen._close()
            return gen.completion
        out["completion_decode_parse"] = timed(completion)
        comp = completion()
        out["response_body"] = timed(lambda: JSONResponse(openai_chat.response_json(req, comp, call_id="x", model="m",
                                                                                   token_logprobs=None)))
        row = {"run_id": rollout["run_id"], "rollout_id": rollout["id"], "api": req.api, "model": "m",
               "adapter": None, "stream": False, "request_json": raw, "prompt_ids": ids, "reused_tokens": 0,
               "prompt_tokens": len(ids), "temperature": 1.0, "top_p": 1.0, "top_k": -1}
        out["record_begin"] = await atimed(lambda: proxy.recorder.begin({**row, "started_at": utcnow()}))
        call_id = await proxy.recorder.begin({**row, "started_at": utcnow()})
        body = openai_chat.response_json(req, comp, call_id="x", model="m", token_logprobs=None)
        end = {"status": "ok", "response_json": body, "completion_ids": comp.completion_ids, "logprobs": comp.logprobs,
               "tool_parse_error": comp.tool_parse_error, "finish_reason": comp.finish_reason,
               "prompt_tokens": len(ids), "completion_tokens": len(comp.completion_ids), "latency_ms": 1.0}
        out["record_end"] = await atimed(lambda: proxy.recorder.end(call_id, {**end, "ended_at": utcnow()}))
        prompt = builder.build(rollout["id"], req.messages, req.prompt_tools)
        out["remember"] = timed(lambda: builder.record(rollout["id"], req.messages, req.prompt_tools, prompt, comp,
                                                       call_id))
        return {k: round(v, 1) for k, v in out.items()}
    finally:
        await proxy.aclose()
        await engine.aclose()


def _baseline_tree(rev: str, tmp: Path) -> Path:
    """The files of revision `rev` in a folder (git archive: the working tree is not touched)."""
    tree = tmp / f"rev-{rev}"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def run(quick: bool = False) -> dict:
    from openforge.engine.tiny import build_tokenizer
    from openforge.store import Store

    n, n_tp, conc, rounds = (60, 200, 32, 1) if quick else (300, 1000, 32, 3)
    rounds = int(os.environ.get("FORGE_BENCH_ROUNDS", rounds))  # more rounds: steadier medians on a busy machine
    baseline_rev = os.environ.get("FORGE_BENCH_BASELINE")
    litellm_exe = os.environ.get("FORGE_BENCH_LITELLM") or shutil.which("litellm")
    agl_python = os.environ.get("FORGE_BENCH_AGL")
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
            if agl_python:
                try:
                    servers["agl"] = _agl(agl_python, engine.url)
                except RuntimeError as exc:
                    print(f"agl: not measured ({exc})")
            else:
                print("agl: not measured (FORGE_BENCH_AGL, the python of a venv with agentlightning==0.3.0, is unset)")
            for w in worker_counts:
                if w > 1:
                    servers[f"forge-w{w}"] = _forge(REPO, store.path, engine.url, model_dir, workers=w)
            paths: dict[str, tuple[_Server, str, dict, list[dict]]] = {}
            for name, server in servers.items():
                if name in ("engine", "passthrough"):
                    paths["direct" if name == "engine" else name] = (server, "/generate", gen, [{}] * conc)
                elif name == "litellm":
                    paths[name] = (server, "/v1/chat/completions", chat, [{}] * conc)
                elif name == "agl":  # one rollout attempt: each call gets its span sequence id there
                    paths[name] = (server, server.prefix + "/v1/chat/completions", chat, [{}] * conc)
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
            agl_spans = _agl_spans(servers.pop("agl"), made["agl"]) if "agl" in servers else None
            stage_key = store.create_rollout(run_id=run_id, task_id="stages", status="running").key
            stages = asyncio.run(_stages(engine.url, store.path, model_dir, stage_key, 100 if quick else 300))
        finally:
            for server in reversed(list(servers.values())):
                server.close()
            store.close()
    med = {k: {m: round(statistics.median(v), 3) for m, v in d.items() if v} for k, d in runs.items()}
    d = med["direct"]
    result: dict[str, Any] = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(output_ids),
                              "concurrency": conc, "rounds": rounds, "calls_c1": n, "calls_c32": n_tp,
                              "systems": med, "recorded_calls_checked": recorded, "stages_us": stages}
    for name, m in med.items():
        if name == "direct" or name.startswith("forge-w"):  # many workers: req/s only (below)
            continue
        added = {"added_p50_ms": m.get("p50", float("nan")) - d["p50"], "added_ttfc_ms": m.get("ttfc", float("nan")) - d["ttfc"],
                 "rps_vs_direct": m["rps"] / d["rps"]}
        result[f"{name}_vs_direct"] = {k: round(v, 3) for k, v in added.items()}
    f = med["forge"]
    p = med["passthrough"]
    result["forge_vs_passthrough"] = {  # what forge costs beyond any HTTP hop, measured side by side
        "added_p50_ms": round(f["p50"] - p["p50"], 3), "added_ttfc_ms": round(f["ttfc"] - p["ttfc"], 3),
        "cpu_ms_c1_diff": round(f["cpu_ms_c1"] - p["cpu_ms_c1"], 3), "cpu_ms_c32_diff": round(f["cpu_ms"] - p["cpu_ms"], 3)}
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
    if agl_spans:
        result["agl_spans"] = agl_spans
    if "agl" in med:
        agl = med["agl"]
        result["forge_vs_agl"] = {"added_p50_ratio": round((f["p50"] - d["p50"]) / (agl["p50"] - d["p50"]), 3),
                                  "cpu_per_call_ratio": round(f["cpu_ms"] / agl["cpu_ms"], 3),
                                  "rps_ratio": round(f["rps"] / agl["rps"], 3)}
    # One worker process is one core's worth of Python: at c=32 it serves about this many calls per
    # second of its own CPU; N workers on N spare cores, about N times it (until the one SQLite writer
    # or the engine is the limit).
    result["forge_calls_per_core_s"] = round(1000 / f["cpu_ms"], 1)
    for w in worker_counts:
        if f"forge-w{w}" in med:
            result[f"forge_w{w}_rps_vs_w1"] = round(med[f"forge-w{w}"]["rps"] / f["rps"], 3)
    _report(result, med)
    return result


def _agl_spans(server: _Server, made: int) -> dict[str, int]:
    """Stops Agent Lightning's proxy and reads what its store holds: spans, and calls with spans (each
    call is one span sequence id). Its recording was on for every call the bench made, or it says so."""
    server.close()
    line = server.proc.stdout.read().strip().splitlines()  # type: ignore[union-attr]
    counts = json.loads(line[-1]) if line else {"spans": 0, "traced_calls": 0}
    if counts["traced_calls"] != made:
        print(f"agl: only {counts['traced_calls']} of the {made} calls made have spans in its store")
    return {**counts, "calls_made": made}


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
        if key.endswith(("_vs_direct", "_vs_passthrough", "_vs_baseline", "_vs_litellm", "_vs_agl", "_vs_w1")) \
                or key in ("recorded_calls_checked", "agl_spans", "stages_us"):
            print(f"{key}: {value}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "serve":
        _serve(sys.argv[2], json.loads(sys.argv[3]))
    else:
        print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
