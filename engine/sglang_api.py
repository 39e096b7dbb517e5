"""One SGLang-API app over a small backend protocol: `create_sglang_app(backend, api_key=...)`.

The embedded engine (engine/embedded.py) and the scripted engine (engine/scripted.py) are backends:
they say what a request produces; this module owns every route, the JSON and SSE shapes of
SGLang's `http_server.py` (see engine/protocol.py) and the credential check of `--api-key`.

Routes: POST|PUT /generate (stream or not), GET /health, /health_generate, /model_info
(= /get_model_info), /server_info (= /get_server_info), /v1/models, POST /load_lora_adapter,
/unload_lora_adapter, /update_weights_from_disk, GET|POST /flush_cache.

Credential, as SGLang's `utils/auth.py` decides it for a NORMAL route: with a key, every request
needs `Authorization: Bearer <key>` (or `x-api-key: <key>`), except OPTIONS and paths starting
with /health, /ready or /metrics (probes carry no secrets); otherwise 401 `{"error": "Unauthorized"}`.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from openforge.engine.protocol import SSE_DONE, BadRequest, CompletionState, error_response, output_chunk, read_json, sse

API_KEY_ENV = "FORGE_ENGINE_API_KEY"  # how EngineProcess hands the key to `python -m openforge.engine` (never argv)
_OPEN_PREFIXES = ("/health", "/ready", "/metrics")


class DropConnection(Exception):
    """Raised by a backend (fault tests) to make the server drop the connection mid-answer."""


class Generation(Protocol):
    """One /generate request inside a backend."""

    rid: str
    prompt_tokens: int
    state: CompletionState  # output so far; `finish` set when done

    def updates(self) -> AsyncIterator[tuple[int, dict[str, Any] | None]]:
        """(tokens produced so far, finish or None), as they come; ends after the finish."""
        ...

    def abort(self) -> None:
        """The client went away: stop generating."""
        ...

    def meta(self) -> dict[str, Any]:
        """Extra `meta_info` fields (e.g. `cached_tokens`)."""
        ...


class SGLangBackend(Protocol):
    """What an engine provides; every HTTP detail lives in create_sglang_app."""

    incremental_stream: bool  # SGLang's --incremental-streaming-output: chunks hold only new tokens

    async def start(self, body: dict[str, Any]) -> Generation:
        """Validate a /generate body and begin it; BadRequest (its .status) to refuse it."""
        ...

    async def healthy(self) -> bool: ...

    async def health_generate(self) -> bool: ...

    def model_info(self) -> dict[str, Any]: ...

    def server_info(self) -> dict[str, Any]: ...

    def loaded_adapters(self) -> dict[str, str]: ...

    async def load_lora(self, name: str, path: str) -> str | None:
        """None on success, else the error message."""
        ...

    async def unload_lora(self, name: str) -> str | None: ...

    async def update_weights(self, path: str, weight_version: str | None) -> str | None: ...

    async def flush_cache(self) -> bool: ...

    def close(self) -> None: ...


class ApiKeyMiddleware:
    """Pure ASGI (not BaseHTTPMiddleware), so a client's disconnect still reaches a stream."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.api_key = api_key

    def allowed(self, method: str, path: str, headers: dict[bytes, bytes]) -> bool:
        if method == "OPTIONS" or path.startswith(_OPEN_PREFIXES):
            return True
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        if scheme.lower() == "bearer" and secrets.compare_digest(token.encode(), self.api_key.encode()):
            return True
        other = headers.get(b"x-api-key")
        return other is not None and secrets.compare_digest(other, self.api_key.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.allowed(scope["method"], scope["path"], dict(scope["headers"])):
            await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _chunk(gen: Generation, n: int, finish: dict[str, Any] | None, body: dict[str, Any],
           started: float) -> dict[str, Any]:
    st = gen.state
    text = st.text() if finish is not None else st.decode(st.output_ids[:n])
    return output_chunk(
        rid=gen.rid, text=text, output_ids=st.output_ids[:n], logprobs=st.logprobs[:n],
        prompt_tokens=gen.prompt_tokens, finish=finish, return_logprob=bool(body.get("return_logprob")),
        e2e_latency=(time.monotonic() - started) if finish is not None else None, extra_meta=gen.meta(),
    )


async def _stream(gen: Generation, body: dict[str, Any], started: float, incremental: bool):
    finish = None
    sent, sent_text = 0, ""
    try:
        async for n, finish in gen.updates():
            chunk = _chunk(gen, n, finish, body, started)
            if incremental:
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
            gen.abort()  # the client went away (or the connection is dropped): free the slot


async def _broken_body():
    raise DropConnection("connection dropped before the answer")
    yield b""  # pragma: no cover - makes this an async generator


def _lora_answer(backend: SGLangBackend, error: str | None) -> Response:
    body = {"success": error is None, "error_message": error, "loaded_adapters": backend.loaded_adapters()}
    return JSONResponse(body, status_code=200 if error is None else 400)


async def _strings(request: Request, *keys: str) -> tuple[str, ...]:
    body = await read_json(request)
    values = tuple(body.get(k) for k in keys)
    if not all(isinstance(v, str) and v for v in values):
        raise BadRequest(f"{' and '.join(keys)} must be non-empty strings")
    return values


class StaticInfo:
    """health, /model_info and /server_info of a backend with nothing to probe and a fixed model: the
    scripted engine and the veRL bridge (whose real engine answers its own health checks)."""

    model_path: str
    model_name: str
    context_length: int
    incremental_stream: bool
    info_version = "static"  # /server_info's "version"
    weight_version = "default"

    async def healthy(self) -> bool:
        return True

    async def health_generate(self) -> bool:
        return True

    def model_info(self) -> dict[str, Any]:
        return {"model_path": self.model_path, "tokenizer_path": self.model_path, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": self.weight_version,
                "served_model_name": self.model_name, "context_length": self.context_length}

    def server_info(self) -> dict[str, Any]:
        return {"model_path": self.model_path, "served_model_name": self.model_name,
                "context_length": self.context_length, "max_req_input_len": self.context_length - 1,
                "incremental_streaming_output": self.incremental_stream, "internal_states": [],
                "version": self.info_version}


def create_sglang_app(backend: SGLangBackend, *, api_key: str = "") -> Starlette:
    """The ASGI app serving `backend` (`app.state.backend`); with `api_key`, every route but the
    probes needs it."""

    async def generate(request: Request) -> Response:
        started = time.monotonic()
        try:
            body = await read_json(request)
            gen = await backend.start(body)
        except BadRequest as exc:
            return error_response(str(exc), exc.status)
        if body.get("stream"):
            return StreamingResponse(_stream(gen, body, started, backend.incremental_stream),
                                     media_type="text/event-stream")
        n, finish = 0, None
        try:
            async for n, finish in gen.updates():
                pass
        except DropConnection:
            return StreamingResponse(_broken_body(), media_type="application/json")
        finally:
            if finish is None:
                gen.abort()
        return JSONResponse(_chunk(gen, n, finish, body, started))

    async def health(request: Request) -> Response:
        return Response(status_code=200 if await backend.healthy() else 503)

    async def health_generate(request: Request) -> Response:
        return Response(status_code=200 if await backend.health_generate() else 503)

    async def model_info(request: Request) -> Response:
        return JSONResponse(backend.model_info())

    async def server_info(request: Request) -> Response:
        return JSONResponse(backend.server_info())

    async def models(request: Request) -> Response:
        info, server = backend.model_info(), backend.server_info()
        name = server.get("served_model_name") or info["model_path"]
        return JSONResponse({"object": "list", "data": [{
            "id": name, "object": "model", "created": int(time.time()), "owned_by": "sglang", "root": name,
            "parent": None, "max_model_len": server.get("context_length")}]})

    async def load_lora(request: Request) -> Response:
        try:
            name, path = await _strings(request, "lora_name", "lora_path")
        except BadRequest as exc:
            return _lora_answer(backend, str(exc))
        return _lora_answer(backend, await backend.load_lora(name, path))

    async def unload_lora(request: Request) -> Response:
        try:
            (name,) = await _strings(request, "lora_name")
        except BadRequest as exc:
            return _lora_answer(backend, str(exc))
        if name not in backend.loaded_adapters():
            return _lora_answer(backend, f"LoRA adapter {name!r} is not loaded")
        return _lora_answer(backend, await backend.unload_lora(name))

    async def update_weights(request: Request) -> Response:
        try:
            body = await read_json(request)
            path = body.get("model_path")
            if not isinstance(path, str) or not path:
                raise BadRequest("model_path must be a non-empty string")
        except BadRequest as exc:
            return JSONResponse({"success": False, "message": str(exc), "num_paused_requests": 0}, status_code=400)
        version = body.get("weight_version")
        error = await backend.update_weights(path, None if version is None else str(version))
        return JSONResponse({"success": error is None, "message": error or "Succeeded to update model weights.",
                             "num_paused_requests": 0}, status_code=200 if error is None else 400)

    async def flush_cache(request: Request) -> Response:
        done = await backend.flush_cache()
        return PlainTextResponse("Cache flushed.\n", status_code=200 if done else 400)

    app = Starlette(routes=[
        Route("/generate", generate, methods=["POST", "PUT"]),
        Route("/health", health, methods=["GET"]),
        Route("/health_generate", health_generate, methods=["GET"]),
        Route("/model_info", model_info, methods=["GET"]),
        Route("/get_model_info", model_info, methods=["GET"]),
        Route("/server_info", server_info, methods=["GET"]),
        Route("/get_server_info", server_info, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/load_lora_adapter", load_lora, methods=["POST"]),
        Route("/unload_lora_adapter", unload_lora, methods=["POST"]),
        Route("/update_weights_from_disk", update_weights, methods=["POST"]),
        Route("/flush_cache", flush_cache, methods=["GET", "POST"]),
    ], lifespan=_lifespan(backend))
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    app.state.backend = backend
    return app


def _lifespan(backend: SGLangBackend):
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        yield
        backend.close()

    return lifespan
