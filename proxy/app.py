"""The recording proxy as an ASGI app: `create_app(config, store_path=..., engine=..., tokenizer=...)`.

It routes, authenticates and reads the request; the call itself is the pipeline's (proxy/pipeline.py).

Routes (also under `/r/<key>/...` for harnesses that can set a base URL but not a key):

    POST /v1/chat/completions      OpenAI Chat Completions     (proxy.openai_chat)
    POST /v1/responses             OpenAI Responses            (proxy.openai_responses)
    POST /v1/messages              Anthropic Messages          (proxy.anthropic)
    POST /v1/messages/count_tokens Anthropic token counting
    GET  /v1/models, /health
    POST /judge/v1/chat/completions the run's own engine as a task's judge, base weights (proxy.judge)

A request's credential (`Authorization: Bearer KEY`, `x-api-key: KEY`, or the path prefix) names its
rollout; unknown keys and rollouts that are no longer pending/running get a 401 in the API's shape.
A judge key (made by the runner once the agent is gone) works on the judge route only, and only it does.
Every error, an unknown path or method included, answers in the shape of the API it was meant for.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

from openforge.engine.client import EngineClient
from openforge.config import ProxyConfig
from openforge.errors import StoreError
from openforge.store import JUDGE_DEADLINE_HEADER, JUDGE_KEY_PREFIX, JUDGE_ROUTE
from openforge.paths import store_home
from openforge.async_store import AsyncStore
from openforge.proxy import anthropic, openai_chat, openai_responses
from openforge.proxy.api_adapters import ApiAdapter, adapter_for_path
from openforge.proxy.calls import APIError, bad_request
from openforge.proxy.judge import JudgeRoute
from openforge.proxy.pipeline import CallPipeline
from openforge.proxy.recorder import Recorder
from openforge.proxy.teacher import Teacher
from openforge.proxy.tokens import ChatRenderer

log = logging.getLogger("forge.proxy")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # \uD800-\uDFFF in JSON text: maybe a lone surrogate
_PARSE_OFF_LOOP = 1 << 20  # bytes; parsing a bigger body in a thread keeps the loop answering


def credential(request: Request) -> str | None:
    key = request.path_params.get("key")
    if key:
        return str(key)
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer " and auth[7:].strip():
        return auth[7:].strip()
    return request.headers.get("x-api-key") or request.headers.get("api-key")


def error_response(adapter: ApiAdapter, err: APIError) -> Response:
    headers = {"retry-after": f"{err.retry_after:g}"} if err.retry_after is not None else {}
    return JSONResponse(adapter.error_json(err), status_code=adapter.error_status(err), headers=headers)


def _has_lone_surrogate(value: Any) -> bool:
    """A lone surrogate (JSON's "\\ud800") cannot be encoded as UTF-8: tokenising or storing it fails."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(v) for v in value)
    return False


def parse_body(raw: str) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, RecursionError):
        raise bad_request("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    # Valid surrogate pairs (how ensure_ascii encoders write emoji) become one character when parsed,
    # so only a body with surrogate escapes needs the walk.
    if _SURROGATE_ESCAPE.search(raw) and _has_lone_surrogate(body):
        raise bad_request("the request body has a lone UTF-16 surrogate (e.g. \\ud800): not valid Unicode text")
    return body


class Proxy:
    """The app's state: store, recorder, rollout lookup, and the call pipeline built on them."""

    def __init__(self, config: ProxyConfig, *, store_path: str | Path, engine: EngineClient | None, tokenizer: Any,
                 served_model: str, recover: bool = True, shared_store: bool = False, vision: Any = None,
                 home: str | Path | None = None, teacher: Teacher | None = None) -> None:
        self.config = config
        self.served_model = served_model
        self.store = AsyncStore(store_path)  # the proxy's one handle on the store
        self.interrupted_on_start = 0
        if recover:  # not in a worker of many: its parent recovered once, before any served a call
            recovered = self.store.recover()
            self.interrupted_on_start = recovered.calls
            if recovered.calls or recovered.runs:
                log.warning("marked %d call(s) left in flight by a stopped proxy, and %d run(s) whose process "
                            "died, as interrupted", recovered.calls, len(recovered.runs))
        self.recorder = Recorder(self.store)
        self.renderer = ChatRenderer(tokenizer, vision)
        # Images go under the data dir the store lives in (`home/forge.db`); a database URL: FORGE_HOME.
        if home is None and "://" not in str(store_path):
            home = store_home(store_path)
        self.pipeline = CallPipeline(config, recorder=self.recorder, engine=engine, renderer=self.renderer,
                                     served_model=served_model, home=Path(home) if home is not None else None,
                                     teacher=teacher)
        # Other worker processes serve this store's rollouts too: check a rollout's turns are current.
        self.pipeline.prompts.shared_store = shared_store
        self.judge = JudgeRoute(self.pipeline, store_path=store_path)

    async def ensure_started(self) -> None:
        # Lazily, inside the serving loop: httpx.ASGITransport runs no lifespan events.
        await self.recorder.start()

    async def aclose(self) -> None:
        await self.pipeline.aclose()
        await asyncio.to_thread(self.judge.close)
        await self.recorder.stop()
        await self.store.close()

    # -- request plumbing -------------------------------------------------------------------

    async def read_body(self, request: Request) -> tuple[str, dict[str, Any]]:
        limit = self.config.max_body_bytes
        too_big = APIError("too_large", f"request body over {limit} bytes (proxy.max_body_bytes)")
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > limit:
            raise too_big
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_big
                chunks.append(chunk)
        except ClientDisconnect:  # gone (or cut off by the read deadline) before its body arrived
            raise APIError("invalid_request", "the client disconnected before sending its whole request") from None
        raw = b"".join(chunks).decode("utf-8", "replace")
        if size > _PARSE_OFF_LOOP:
            return raw, await asyncio.to_thread(parse_body, raw)
        return raw, parse_body(raw)

    async def rollout(self, request: Request) -> dict[str, Any]:
        key = credential(request)
        if not key:
            raise APIError("authentication", "missing API key: send the rollout's key as "
                           "'Authorization: Bearer KEY' or 'x-api-key: KEY'")
        if key.startswith(JUDGE_KEY_PREFIX):  # a judge's calls are never the policy's
            raise APIError("authentication", "a judge key works on /judge/v1/chat/completions only")
        rollout = await self.store.rollout_by_key(key)
        if rollout is None:
            raise APIError("authentication", "invalid API key: no live rollout has this key "
                           "(unknown, or its rollout or run has ended)")
        return rollout

    # -- the endpoints ----------------------------------------------------------------------

    async def handle_call(self, request: Request, adapter: ApiAdapter) -> Response:
        try:
            await self.ensure_started()
            rollout = await self.rollout(request)
            raw, body = await self.read_body(request)
            return await self.pipeline.run(adapter, rollout, adapter.parse_request(body), raw)
        except APIError as err:
            return error_response(adapter, err)
        except StoreError as exc:
            return error_response(adapter, APIError("server", f"the proxy could not record the call: {exc}"))
        except Exception as exc:  # noqa: BLE001 - a bug must still answer in the API's shape, never hang
            log.exception("proxy: unexpected error in a %s call", adapter.API)
            return error_response(adapter, APIError("server", f"internal proxy error: {type(exc).__name__}: {exc}"))

    async def handle_judge(self, request: Request) -> Response:
        """A judge call on the run's engine with its base weights (proxy/judge.py)."""
        try:
            await self.ensure_started()
            key = credential(request)
            if not key or not key.startswith(JUDGE_KEY_PREFIX):
                raise APIError("authentication", "the judge route takes a rollout's judge key, which the runner "
                               "makes once the agent is gone")
            rollout = await self.store.rollout_by_key(key)
            if rollout is None:
                raise APIError("authentication", "invalid judge key: no live rollout has it")
            raw, body = await self.read_body(request)
            return await self.judge.serve(rollout, body, raw, timeout_s=self._judge_deadline(request))
        except APIError as exc:
            err = exc
        except StoreError as exc:
            err = APIError("server", f"the proxy could not read the store: {exc}")
        except Exception as exc:  # noqa: BLE001 - a bug must still answer in the API's shape, never hang
            log.exception("proxy: unexpected error in a judge call")
            err = APIError("server", f"internal proxy error: {type(exc).__name__}: {exc}")
        return error_response(openai_chat, err)  # type: ignore[arg-type]

    def _judge_deadline(self, request: Request) -> float:
        """The caller's limit (the runner's judge.timeout_s) within proxy.call_timeout_s."""
        try:
            asked = float(request.headers.get(JUDGE_DEADLINE_HEADER, ""))
        except ValueError:
            return self.config.call_timeout_s
        return min(asked, self.config.call_timeout_s) if asked > 0 else self.config.call_timeout_s

    async def count_tokens(self, request: Request) -> Response:
        try:
            await self.ensure_started()
            rollout = await self.rollout(request)
            raw, body = await self.read_body(request)
            req = anthropic.parse_request(body, count_only=True)
            count = await self.pipeline.count_tokens(rollout["id"], req, len(raw))
        except APIError as err:
            return error_response(anthropic, err)  # type: ignore[arg-type]
        return JSONResponse({"input_tokens": count})

    async def models(self, request: Request) -> Response:
        try:
            await self.ensure_started()
            await self.rollout(request)
        except APIError as err:
            return error_response(openai_chat, err)  # type: ignore[arg-type]
        # One list both SDKs read: OpenAI's {object, data[id, object, created, owned_by]} and
        # Anthropic's {data[id, type, display_name, created_at], has_more, first_id, last_id}; and the
        # context this proxy serves (`context_length`, as OpenRouter's listing names it; null: unknown),
        # which the runner tells the harness (its spec's [context], docs/harnesses.md).
        name = self.served_model
        model = {"id": name, "object": "model", "created": 0, "owned_by": "openforge", "type": "model",
                 "display_name": name, "created_at": "1970-01-01T00:00:00Z",
                 "context_length": await self.pipeline.context_limit()}
        return JSONResponse({"object": "list", "data": [model], "has_more": False, "first_id": name, "last_id": name})


def create_app(config: ProxyConfig, *, store_path: str | Path, engine: EngineClient | None, tokenizer: Any,
               served_model: str | None = None, close_engine: bool = False, recover: bool = True,
               shared_store: bool = False, vision: Any = None, home: str | Path | None = None,
               teacher: Teacher | None = None) -> Starlette:
    """The proxy app. `app.state.proxy` is the `Proxy` (tests read its recorder and pipeline).
    With `close_engine`, shutting the app down also closes the engine client (its owner is the app).
    A worker of many (proxy/workers.py) passes `recover=False, shared_store=True`. `vision`: a VLM's
    image placeholders (proxy/vision.load_placeholders); without it, images are refused.
    `home`: the data dir whose runs/<run>/images/ get the calls' images (default: the store's folder).
    `teacher` (engine.kind = "remote", proxy/teacher.py): every call goes to it, not to `engine` (None),
    and is recorded in the tokens of `tokenizer`, the student's."""
    proxy = Proxy(config, store_path=store_path, engine=engine, tokenizer=tokenizer,
                  served_model=served_model or config.served_model_name, recover=recover,
                  shared_store=shared_store, vision=vision, home=home, teacher=teacher)

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
                for client in (engine, teacher):
                    if client is not None:
                        await client.aclose()

    async def no_route(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        kind = "not_allowed" if status == 405 else "not_found"
        where = f"{request.method} {request.url.path}"
        message = f"{where} is not allowed here" if status == 405 else f"no such endpoint: {where}"
        return error_response(adapter_for_path(request.url.path), APIError(kind, message))

    app = Starlette(routes=[*api_routes, Route("/health", health, methods=["GET"]),
                            Route(f"{JUDGE_ROUTE}/chat/completions", proxy.handle_judge, methods=["POST"]),
                            Route("/", health, methods=["GET", "HEAD"]),
                            Mount("/r/{key}", routes=api_routes)], lifespan=lifespan,
                    exception_handlers={404: no_route, 405: no_route})
    app.state.proxy = proxy
    return app
