"""The recording proxy as an ASGI app: `create_app(config, store_path=..., engine=..., tokenizer=...)`.

Routes (also under `/r/<key>/...` for harnesses that can set a base URL but not a key):

    POST /v1/chat/completions      OpenAI Chat Completions     (proxy.openai_chat)
    POST /v1/responses             OpenAI Responses            (proxy.openai_responses)
    POST /v1/messages              Anthropic Messages          (proxy.anthropic)
    POST /v1/messages/count_tokens Anthropic token counting
    GET  /v1/models, /health

A request's credential (`Authorization: Bearer KEY`, `x-api-key: KEY`, or the path prefix) names its
rollout; unknown keys and rollouts that are no longer pending/running get a 401 in the API's shape.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route

from engine.client import EngineClient
from openforge.config import ProxyConfig
from openforge.errors import StoreError
from openforge.store import Store
from proxy import anthropic, openai_chat, openai_responses
from proxy.calls import API_ANTHROPIC, API_CHAT, API_RESPONSES, APIError, bad_request
from proxy.generation import token_logprobs
from proxy.recorder import Recorder, RolloutLookup, interrupt_stale_calls
from proxy.service import CallService, Prepared
from proxy.tokens import ChatRenderer

log = logging.getLogger("forge.proxy")
APIS: dict[str, ModuleType] = {API_CHAT: openai_chat, API_RESPONSES: openai_responses, API_ANTHROPIC: anthropic}
LIVE_ROLLOUT = ("pending", "running")


def credential(request: Request) -> str | None:
    key = request.path_params.get("key")
    if key:
        return str(key)
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer " and auth[7:].strip():
        return auth[7:].strip()
    return request.headers.get("x-api-key") or request.headers.get("api-key")


def error_response(api: ModuleType, err: APIError) -> Response:
    headers = {"retry-after": f"{err.retry_after:g}"} if err.retry_after is not None else {}
    return JSONResponse(api.error_json(err), status_code=api.error_status(err), headers=headers)


class Proxy:
    """The app's state: store, recorder, engine, tokenizer, and the call service built on them."""

    def __init__(self, config: ProxyConfig, *, store_path: str | Path, engine: EngineClient, tokenizer: Any,
                 served_model: str) -> None:
        self.config = config
        self.served_model = served_model
        self.interrupted_on_start = interrupt_stale_calls(Path(store_path))
        if self.interrupted_on_start:
            log.warning("marked %d call(s) left in flight by a stopped proxy as interrupted",
                        self.interrupted_on_start)
        self.store = Store(store_path)
        self.recorder = Recorder(self.store)
        self.lookup = RolloutLookup(Path(store_path))
        self._background: set[asyncio.Future] = set()
        self.renderer = ChatRenderer(tokenizer)
        self.service = CallService(config, recorder=self.recorder, engine=engine,
                                   renderer=self.renderer, served_model=served_model, api_modules=APIS)

    async def ensure_started(self) -> None:
        # Lazily, inside the serving loop: httpx.ASGITransport runs no lifespan events.
        await self.recorder.start()

    async def aclose(self) -> None:
        if self._background:  # streams being wound up still write their rows
            await asyncio.wait(list(self._background), timeout=10)
        await self.recorder.stop()
        self.lookup.close()
        self.store.close()

    # -- request plumbing -------------------------------------------------------------------

    async def read_body(self, request: Request) -> tuple[str, dict[str, Any]]:
        limit = self.config.max_body_bytes
        too_big = APIError("too_large", f"request body over {limit} bytes (proxy.max_body_bytes)")
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > limit:
            raise too_big
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_big
            chunks.append(chunk)
        raw = b"".join(chunks).decode("utf-8", "replace")
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, RecursionError):
            raise bad_request("the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object")
        return raw, body

    async def rollout(self, request: Request) -> dict[str, Any]:
        key = credential(request)
        if not key:
            raise APIError("authentication", "missing API key: send the rollout's key as "
                           "'Authorization: Bearer KEY' or 'x-api-key: KEY'")
        rollout = self.lookup.by_key(key)
        if rollout is None:
            raise APIError("authentication", "invalid API key: no rollout has this key")
        if rollout["status"] not in LIVE_ROLLOUT:
            raise APIError("authentication", f"rollout {rollout['id']} is {rollout['status']}; its key no longer works")
        return rollout

    # -- the endpoints ----------------------------------------------------------------------

    async def handle_call(self, request: Request, api: ModuleType) -> Response:
        try:
            await self.ensure_started()
            rollout = await self.rollout(request)
            raw, body = await self.read_body(request)
            req = api.parse_request(body)
            await self.service.slot()
        except APIError as err:
            return error_response(api, err)
        p: Prepared | None = None
        streaming = False
        try:
            p = await self.service.prepare(api, rollout, req, raw, api.TOOL_ID_PREFIX)
            if not req.stream:
                return JSONResponse(await self.service.complete(p))
            response = await self.start_stream(p)
            streaming = True  # the stream's body gives the slot back when it ends
            return response
        except APIError as err:  # already recorded where it happened
            return error_response(api, err)
        except StoreError as exc:
            return error_response(api, APIError("server", f"the proxy could not record the call: {exc}"))
        except Exception as exc:  # noqa: BLE001 - a bug must still answer in the API's shape, never hang
            log.exception("proxy: unexpected error in a %s call", req.api)
            err = APIError("server", f"internal proxy error: {type(exc).__name__}: {exc}")
            if p is not None:
                await self.service.record_error(p, err.message)
            return error_response(api, err)
        finally:
            if not streaming:
                self.service.release()

    async def start_stream(self, p: Prepared) -> Response:
        """Wait for the engine's first tokens before answering 200, so an engine that is down is a
        retryable error status rather than a stream that breaks."""
        events = self.service.events(p)
        try:
            await events.__anext__()
            await p.row  # the in-flight row is committed before the first byte
        except (APIError, StopAsyncIteration) as exc:
            await events.aclose()
            err = exc if isinstance(exc, APIError) else APIError("overloaded", "the engine returned nothing; retry")
            await self.service.record_error(p, err.message)
            raise err from None
        except BaseException:
            await events.aclose()
            raise
        return StreamingResponse(self.stream_body(p, events), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache", "x-accel-buffering": "no"})

    async def stream_body(self, p: Prepared, events: AsyncIterator[Any]) -> AsyncIterator[str]:
        stream = p.api.Stream(p.req, call_id=p.response_id, model=p.model, prompt_tokens=len(p.prompt.ids))
        done = False
        try:
            for line in stream.start():
                yield line
            async for ev in events:
                if ev is not None:
                    for line in stream.event(ev):
                        yield line
            comp = p.generation.completion
            assert comp is not None
            body = self.service.response_body(p, comp)
            await self.service.record_ok(p, comp, body)  # committed before the last chunk goes out
            done = True
            lps = token_logprobs(self.service.r, comp) if p.req.logprobs else None
            for line in stream.finish(comp, lps):
                yield line
        except APIError as err:
            await self.service.record_error(p, err.message)
            done = True
            for line in stream.error(err):
                yield line
        except StoreError as exc:
            done = True
            for line in stream.error(APIError("server", f"the proxy could not record the call: {exc}")):
                yield line
        except Exception as exc:  # noqa: BLE001 - a bug ends the stream with the API's error event
            log.exception("proxy: unexpected error while streaming a %s call", p.req.api)
            err = APIError("server", f"internal proxy error: {type(exc).__name__}: {exc}")
            await self.service.record_error(p, err.message)
            done = True
            for line in stream.error(err):
                yield line
        finally:
            # The slot is given back first and the rest runs as its own task: when the client went
            # away, this generator is cancelled, and every await here would be cancelled again.
            self.service.release()
            task = asyncio.ensure_future(self._end_stream(p, events, done))
            self._background.add(task)  # held: the loop keeps only weak references to tasks
            task.add_done_callback(self._background.discard)

    async def _end_stream(self, p: Prepared, events: AsyncIterator[Any], done: bool) -> None:
        await events.aclose()  # closes the engine request: SGLang aborts the generation
        if not done:  # the client went away mid-stream
            await self.service.record_error(p, "the client disconnected before the response completed")

    async def count_tokens(self, request: Request) -> Response:
        try:
            await self.ensure_started()
            rollout = await self.rollout(request)
            _, body = await self.read_body(request)
            req = anthropic.parse_request(body, count_only=True)
            prompt = await self.service.prompt_for(rollout["id"], req)
        except APIError as err:
            return error_response(anthropic, err)
        return JSONResponse({"input_tokens": len(prompt.ids)})

    async def models(self, request: Request) -> Response:
        try:
            await self.ensure_started()
            await self.rollout(request)
        except APIError as err:
            return error_response(openai_chat, err)
        # One list both SDKs read: OpenAI's {object, data[id, object, created, owned_by]} and
        # Anthropic's {data[id, type, display_name, created_at], has_more, first_id, last_id}.
        name = self.served_model
        model = {"id": name, "object": "model", "created": 0, "owned_by": "openforge", "type": "model",
                 "display_name": name, "created_at": "1970-01-01T00:00:00Z"}
        return JSONResponse({"object": "list", "data": [model], "has_more": False, "first_id": name, "last_id": name})


def create_app(config: ProxyConfig, *, store_path: str | Path, engine: EngineClient, tokenizer: Any,
               served_model: str | None = None, close_engine: bool = False) -> Starlette:
    """The proxy app. `app.state.proxy` is the `Proxy` (tests read its recorder and service).
    With `close_engine`, shutting the app down also closes the engine client (its owner is the app)."""
    proxy = Proxy(config, store_path=store_path, engine=engine, tokenizer=tokenizer,
                  served_model=served_model or config.served_model_name)

    async def chat(request: Request) -> Response:
        return await proxy.handle_call(request, openai_chat)

    async def responses(request: Request) -> Response:
        return await proxy.handle_call(request, openai_responses)

    async def messages(request: Request) -> Response:
        return await proxy.handle_call(request, anthropic)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": proxy.served_model})

    api_routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", proxy.count_tokens, methods=["POST"]),
        Route("/v1/models", proxy.models, methods=["GET"]),
    ]

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await proxy.ensure_started()
        try:
            yield
        finally:
            await proxy.aclose()
            if close_engine:
                await engine.aclose()

    app = Starlette(routes=[*api_routes, Route("/health", health, methods=["GET"]),
                            Route("/", health, methods=["GET", "HEAD"]),
                            Mount("/r/{key}", routes=api_routes)], lifespan=lifespan)
    app.state.proxy = proxy
    return app
