"""The embedded engine: SGLang's native HTTP API served from transformers + torch, CPU by default.

    app = create_engine_app(EngineConfig(model="~/.forge/models/tiny"))   # a Starlette app

Routes (SGLang's shapes, see engine/protocol.py): POST /generate (stream or not), GET /health,
/health_generate, /model_info (= /get_model_info), POST /load_lora_adapter, /unload_lora_adapter,
/update_weights_from_disk, GET|POST /flush_cache. Continuous batching, sampling and LoRA live in
engine/scheduler.py, engine/sampling.py and engine/lora.py; this module is the HTTP edge.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from typing import Any

import torch
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.model import LoadedModel, load_model
from engine.protocol import (
    SSE_DONE,
    BadRequest,
    CompletionState,
    error_response,
    output_chunk,
    parse_input_ids,
    parse_sampling_params,
    read_json,
    sse,
)
from engine.scheduler import Scheduler, Sequence
from engine.weights import copy_weights_from_disk
from openforge.config import EngineConfig
from openforge.errors import EngineError


class EmbeddedEngine:
    """The model, its scheduler thread, and the Starlette app (`.app`) in front of them."""

    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None, *, incremental_stream: bool = True) -> None:
        self.config = config
        # Stream chunks hold only the new tokens, as SGLang's --incremental-streaming-output does;
        # SGLang's default (cumulative chunks) resends the whole completion per token, which is
        # quadratic in its length. EngineClient reads either.
        self.incremental_stream = incremental_stream
        self.m = loaded or load_model(config.model, dtype=config.dtype, device=config.device)
        self.scheduler = Scheduler(self.m, max_batch_size=config.max_batch_size)
        self.weight_version = "default"
        self._seeds = itertools.count()
        self.app = Starlette(
            routes=[
                Route("/generate", self._generate, methods=["POST", "PUT"]),
                Route("/health", self._health, methods=["GET"]),
                Route("/health_generate", self._health_generate, methods=["GET"]),
                Route("/model_info", self._model_info, methods=["GET"]),
                Route("/get_model_info", self._model_info, methods=["GET"]),
                Route("/load_lora_adapter", self._load_lora, methods=["POST"]),
                Route("/unload_lora_adapter", self._unload_lora, methods=["POST"]),
                Route("/update_weights_from_disk", self._update_weights, methods=["POST"]),
                Route("/flush_cache", self._flush_cache, methods=["GET", "POST"]),
            ],
            lifespan=self._lifespan,
        )
        self.app.state.engine = self

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette):
        yield
        self.close()

    def close(self) -> None:
        self.scheduler.close()

    # -- generation -------------------------------------------------------------------------

    def _sequence(self, body: dict[str, Any], loop: asyncio.AbstractEventLoop, events: asyncio.Queue) -> Sequence:
        if "input_ids" not in body and isinstance(body.get("text"), str):  # SGLang also takes text
            body = {**body, "input_ids": list(self.m.tokenizer.encode(body["text"]))}
        input_ids = parse_input_ids(body, len(self.m.tokenizer))
        params = parse_sampling_params(body.get("sampling_params"))
        ctx = self.m.context_length
        if len(input_ids) >= ctx:
            raise BadRequest(f"The input ({len(input_ids)} tokens) is longer than the model's context length ({ctx} tokens).")
        adapter = body.get("lora_path")
        if adapter is not None and (adapter not in self.scheduler.adapters.paths
                                    or adapter in self.scheduler.closing_adapters):
            raise BadRequest(f"LoRA adapter {adapter!r} is not loaded")
        # Per-request generator: SGLang's `sampling_seed`, else one derived from the engine seed and
        # the request's arrival number (reproducible for the same request order).
        seed = params.sampling_seed if params.sampling_seed is not None else self.config.seed * 1_000_003 + next(self._seeds)
        gen = torch.Generator(device=self.m.device).manual_seed(seed)
        skip = params.skip_special_tokens
        state = CompletionState(params, self.m.eos_ids, lambda ids: self.m.tokenizer.decode(ids, skip_special_tokens=skip))

        def emit(seq: Sequence) -> None:  # scheduler thread: snapshot now, deliver on the loop
            snapshot = (len(seq.state.output_ids), seq.state.finish)
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is listening
                loop.call_soon_threadsafe(events.put_nowait, snapshot)

        return Sequence(rid=str(body.get("rid") or uuid.uuid4().hex), input_ids=input_ids, params=params,
                        adapter=adapter, state=state, generator=gen, emit=emit, stream=bool(body.get("stream")))

    def _chunk(self, seq: Sequence, n: int, finish: dict | None, body: dict[str, Any], started: float) -> dict[str, Any]:
        st = seq.state
        text = st.text() if finish is not None else st.decode(st.output_ids[:n])
        return output_chunk(
            rid=seq.rid, text=text, output_ids=st.output_ids[:n], logprobs=st.logprobs[:n],
            prompt_tokens=len(seq.input_ids), finish=finish, return_logprob=bool(body.get("return_logprob")),
            e2e_latency=(time.monotonic() - started) if finish is not None else None,
            extra_meta={"weight_version": self.weight_version},
        )

    async def _generate(self, request: Request) -> Response:
        started = time.monotonic()
        events: asyncio.Queue = asyncio.Queue()
        try:
            body = await read_json(request)
            seq = self._sequence(body, asyncio.get_running_loop(), events)
        except BadRequest as exc:
            return error_response(str(exc))
        if not self.scheduler.alive:
            return error_response("the engine's scheduler is not running", 503)
        self.scheduler.submit(seq)
        if body.get("stream"):
            return StreamingResponse(self._stream(seq, events, body, started), media_type="text/event-stream")
        try:
            finish = None
            while finish is None:
                n, finish = await events.get()
        finally:
            if finish is None:
                seq.aborted = True
        return JSONResponse(self._chunk(seq, n, finish, body, started))

    async def _stream(self, seq: Sequence, events: asyncio.Queue, body: dict[str, Any], started: float):
        finish = None
        sent, sent_text = 0, ""
        try:
            while finish is None:
                n, finish = await events.get()
                while finish is None and not events.empty():  # coalesce: send only the newest state
                    n, finish = events.get_nowait()
                chunk = self._chunk(seq, n, finish, body, started)
                if self.incremental_stream:
                    text = chunk["text"]
                    chunk["text"] = text[len(sent_text):] if text.startswith(sent_text) else text
                    chunk["output_ids"] = chunk["output_ids"][sent:]
                    if "output_token_logprobs" in chunk["meta_info"]:
                        chunk["meta_info"]["output_token_logprobs"] = chunk["meta_info"]["output_token_logprobs"][sent:]
                    sent, sent_text = n, text
                yield sse(chunk)
            yield SSE_DONE
        finally:
            if finish is None:
                seq.aborted = True  # the client went away: free the batch slot

    # -- health and info --------------------------------------------------------------------

    async def _health(self, request: Request) -> Response:
        return Response(status_code=200 if self.scheduler.alive else 503)

    async def _health_generate(self, request: Request) -> Response:
        events: asyncio.Queue = asyncio.Queue()
        body = {"input_ids": [0], "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        seq = self._sequence(body, asyncio.get_running_loop(), events)
        self.scheduler.submit(seq)
        try:
            async with asyncio.timeout(20):
                finish = None
                while finish is None:
                    _, finish = await events.get()
        except TimeoutError:
            seq.aborted = True
            return Response(status_code=503)
        return Response(status_code=200 if finish.get("type") != "abort" else 503)

    async def _model_info(self, request: Request) -> Response:
        return JSONResponse({
            "model_path": str(self.m.path), "tokenizer_path": str(self.m.path), "is_generation": True,
            "preferred_sampling_params": None, "weight_version": self.weight_version,
            "engine": "embedded", "context_length": self.m.context_length, "device": str(self.m.device),
            "dtype": str(self.m.dtype).removeprefix("torch."), "max_batch_size": self.config.max_batch_size,
            "loaded_adapters": dict(self.scheduler.adapters.paths),
        })

    # -- control ----------------------------------------------------------------------------

    async def _run(self, fn: Any, ready: Any = lambda: True, exclusive: bool = False) -> str | None:
        """Run `fn` on the scheduler thread; the error message, or None on success."""
        try:
            await asyncio.wrap_future(self.scheduler.call(fn, ready, exclusive=exclusive))
        except EngineError as exc:
            return str(exc)
        except RuntimeError as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    def _lora_answer(self, error: str | None) -> Response:
        body = {"success": error is None, "error_message": error, "loaded_adapters": dict(self.scheduler.adapters.paths)}
        return JSONResponse(body, status_code=200 if error is None else 400)

    async def _lora_body(self, request: Request, *keys: str) -> tuple[str, ...]:
        body = await read_json(request)
        values = tuple(body.get(k) for k in keys)
        if not all(isinstance(v, str) and v for v in values):
            raise BadRequest(f"{' and '.join(keys)} must be non-empty strings")
        return values

    async def _load_lora(self, request: Request) -> Response:
        try:
            name, path = await self._lora_body(request, "lora_name", "lora_path")
        except BadRequest as exc:
            return self._lora_answer(str(exc))
        return self._lora_answer(await self._run(lambda: self.scheduler.adapters.load(name, path)))

    async def _unload_lora(self, request: Request) -> Response:
        try:
            (name,) = await self._lora_body(request, "lora_name")
        except BadRequest as exc:
            return self._lora_answer(str(exc))
        if name not in self.scheduler.adapters.paths:
            return self._lora_answer(f"LoRA adapter {name!r} is not loaded")
        # Like SGLang: refuse new requests for it at once, unload when its in-flight requests finish.
        self.scheduler.closing_adapters.add(name)
        try:
            error = await self._run(lambda: self.scheduler.adapters.unload(name),
                                    ready=lambda: not self.scheduler.uses_adapter(name))
        finally:
            self.scheduler.closing_adapters.discard(name)
        return self._lora_answer(error)

    async def _update_weights(self, request: Request) -> Response:
        try:
            body = await read_json(request)
            path = body.get("model_path")
            if not isinstance(path, str) or not path:
                raise BadRequest("model_path must be a non-empty string")
        except BadRequest as exc:
            return JSONResponse({"success": False, "message": str(exc), "num_paused_requests": 0}, status_code=400)
        # Between steps and with no sequence running: no request sees a half-updated model.
        error = await self._run(lambda: copy_weights_from_disk(self.m, path), exclusive=True)
        if error is None:
            self.weight_version = str(body.get("weight_version") or path)
        return JSONResponse({"success": error is None, "message": error or "Succeeded to update model weights.",
                             "num_paused_requests": 0}, status_code=200 if error is None else 400)

    async def _flush_cache(self, request: Request) -> Response:
        # No prefix cache is kept across requests, so there is nothing to flush; answer like SGLang.
        return PlainTextResponse("Cache flushed.\n")


def create_engine_app(config: EngineConfig) -> Starlette:
    """Load `config.model` and return the engine's ASGI app (`app.state.engine` is the EmbeddedEngine)."""
    return EmbeddedEngine(config).app


def _pick_cpu_threads(m: LoadedModel) -> None:
    """One intra-op thread for small models on CPU (this process is the engine's own).

    A decode step of a small model is many tiny matmuls; OpenMP's fork/join per op then costs more
    than the op, and on a busy machine it is catastrophic (measured here: a [8x64]x[64x128] linear
    takes 27 us on 1 thread, 3.8 ms on 2 when the other core is busy). Big models keep torch's default."""
    if m.device.type == "cpu" and sum(p.numel() for p in m.model.parameters()) < 50_000_000:
        torch.set_num_threads(1)


def serve_engine(config: EngineConfig, *, announce=print) -> None:
    """Run the embedded engine in the foreground until SIGINT/SIGTERM (`forge engine`, `python -m engine`).

    The socket is bound first, so `port=0` works and the announced URL is the real one; connections
    made while the model loads wait in the listen backlog and are answered once it is serving."""
    import socket

    import uvicorn

    sock = socket.socket(socket.AF_INET6 if ":" in config.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((config.host, config.port))
    except OSError as exc:
        raise EngineError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}") from None
    port = sock.getsockname()[1]
    host = f"[{config.host}]" if ":" in config.host else config.host
    engine = EmbeddedEngine(config)
    _pick_cpu_threads(engine.m)
    announce(f"engine: serving {engine.m.path} at http://{host}:{port} ({engine.m.device}, {str(engine.m.dtype).removeprefix('torch.')})")
    server = uvicorn.Server(uvicorn.Config(engine.app, log_level="warning", access_log=False, timeout_graceful_shutdown=5))
    try:
        server.run(sockets=[sock])
    finally:
        engine.close()
        sock.close()
