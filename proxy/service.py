"""The life of one call, whatever its API: prompt ids -> in-flight row -> engine -> finished row -> reply.

The API module (openai_chat, openai_responses, anthropic) only translates; everything that must be
the same for every API lives here: token reuse, limits, the per-call timeout, recording, and turning
engine failures into a retryable API error instead of a hung connection.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from engine.client import EngineClient
from openforge.config import ProxyConfig
from openforge.errors import EngineError, EngineRejected, EngineTimeout, EngineUnavailable, StoreError
from openforge.store import utcnow
from proxy.calls import APIError, CallRequest, Completion, TextDelta, ToolCallEvent, new_call_id
from proxy.generation import Generation, GenerationParams, token_logprobs
from proxy.recorder import Recorder
from proxy.tokens import ChatRenderer, Prompt, PromptBuilder, parse_completion


@dataclass
class Prepared:
    """A call that has its prompt and its in-flight row, ready for the engine."""

    api: ModuleType
    rollout: dict[str, Any]
    req: CallRequest
    prompt: Prompt
    row: asyncio.Future  # -> the call row's id, once its in-flight insert is committed
    response_id: str
    model: str
    started: float
    generation: Generation


def engine_error(exc: EngineError) -> APIError:
    """Engine trouble by its type: a timeout or an engine that is down is the caller's to retry; a
    request the engine refused (4xx) is not, so it is a 400 (or, for the proxy's own credentials, a 500)."""
    if isinstance(exc, EngineRejected):
        if exc.status == 400:
            return APIError("invalid_request", f"the inference engine refused this call: {exc}")
        return APIError("server", f"the inference engine refused the proxy: {exc}")
    kind = "timeout" if isinstance(exc, EngineTimeout) else "overloaded"
    return APIError(kind, f"the inference engine failed this call, retry it: {exc}", retry_after=1.0)


class CallService:
    def __init__(self, config: ProxyConfig, *, recorder: Recorder, engine: EngineClient,
                 renderer: ChatRenderer, served_model: str, api_modules: dict[str, ModuleType]) -> None:
        self.config = config
        self.recorder = recorder
        self.engine = engine
        self.r = renderer
        self.served_model = served_model
        self.apis = api_modules
        self.builder = PromptBuilder(renderer)
        self.slots = asyncio.Semaphore(config.max_concurrent_calls)
        self.pending = 0  # calls holding or waiting for a slot
        self._warm_locks: dict[str, asyncio.Lock] = {}

    # -- preparing ---------------------------------------------------------------------------

    async def prompt_for(self, rollout_id: str, req: CallRequest) -> Prompt:
        await self._warm(rollout_id)
        prompt = self.builder.plan(rollout_id, req.messages, req.prompt_tools)
        if len(prompt.tail) > 8192:  # a long first prompt (Claude Code's is ~80 KB): tokenise off the loop
            prompt = await asyncio.to_thread(self.builder.encode_tail, prompt)
        else:
            self.builder.encode_tail(prompt)
        if len(prompt.ids) > self.config.max_context_tokens:
            raise APIError("invalid_request", f"the prompt is {len(prompt.ids)} tokens, over this proxy's "
                           f"limit of {self.config.max_context_tokens} (proxy.max_context_tokens)", param="messages")
        return prompt

    async def _warm(self, rollout_id: str) -> None:
        """After a proxy restart, relearn a rollout's last turns from the store so reuse continues."""
        if self.builder.knows(rollout_id):
            return
        lock = self._warm_locks.setdefault(rollout_id, asyncio.Lock())
        async with lock:
            if self.builder.knows(rollout_id):
                return
            rows = (await self.recorder.calls_of_rollout(rollout_id))[-self.builder.turns_per_rollout:]
            for row in rows:
                api = self.apis.get(row.api)
                try:
                    old = api.parse_request(row.request_json) if api and row.request_json else None
                except (APIError, ValueError, TypeError):
                    old = None
                if old is None:
                    continue
                ids = row.completion_ids or []
                comp = self._replayed_completion(ids, old.stop, row.tool_calls_json or [])
                prompt = Prompt(row.prompt_ids or [], "", row.reused_tokens)
                self.builder.record(rollout_id, old.messages, old.prompt_tools, prompt, comp, row.id)
            self.builder.mark_known(rollout_id)
        self._warm_locks.pop(rollout_id, None)

    def _replayed_completion(self, ids: list[int], stops: list[str], tool_calls: list[dict[str, Any]]) -> Completion:
        """A recorded completion as the client saw it: text cut at its stop string, the same call ids."""
        text = self.r.decode(ids)
        hits = [text.find(s) for s in stops if s in text]
        parsed = parse_completion(text[:min(hits)] if hits else text)
        for call, recorded in zip(parsed.calls, tool_calls):
            call.id = recorded.get("id", call.id)
        return Completion(parsed.text, parsed.calls, "stop", ids, [], 0)

    def _sampling(self, req: CallRequest, prompt_len: int) -> dict[str, Any]:
        room = self.config.max_context_tokens - prompt_len
        max_new = min(req.max_tokens or self.config.default_max_tokens, max(room, 1))
        params: dict[str, Any] = {"max_new_tokens": max_new, "stop_token_ids": self.r.stop_token_ids}
        temperature = self.config.temperature_override if self.config.temperature_override is not None \
            else req.temperature
        if temperature is not None:
            params["temperature"] = temperature
        if req.top_p is not None:
            params["top_p"] = req.top_p
        if req.stop:
            params["stop"] = req.stop
        return params

    async def prepare(self, api: ModuleType, rollout: dict[str, Any], req: CallRequest, raw_body: str,
                      id_prefix: str) -> Prepared:
        prompt = await self.prompt_for(rollout["id"], req)
        model = req.model or self.served_model
        # The in-flight row is committed while the engine starts on the prompt (not before it): the
        # insert is off the critical path, and `row` is awaited before any byte of the answer goes out.
        row = asyncio.ensure_future(self.recorder.begin({
            "run_id": rollout["run_id"], "rollout_id": rollout["id"], "api": req.api, "model": model,
            "adapter": rollout.get("adapter"), "stream": req.stream, "request_json": raw_body,
            "prompt_ids": prompt.ids, "reused_tokens": prompt.reused_tokens,
            "prompt_tokens": len(prompt.ids), "started_at": utcnow(),
        }))
        params = GenerationParams(prompt.ids, self._sampling(req, len(prompt.ids)), req.stop, rollout.get("adapter"),
                                  rid=new_call_id(rollout["id"]), id_prefix=id_prefix)
        return Prepared(api, rollout, req, prompt, row, new_call_id(api.RESPONSE_ID_PREFIX), model,
                        time.perf_counter(), Generation(self.engine, self.r, params))

    # -- finishing ---------------------------------------------------------------------------

    def response_body(self, p: Prepared, comp: Completion) -> dict[str, Any]:
        lps = token_logprobs(self.r, comp) if p.req.logprobs else None
        return p.api.response_json(p.req, comp, call_id=p.response_id, model=p.model, token_logprobs=lps)

    async def record_ok(self, p: Prepared, comp: Completion, body: dict[str, Any]) -> None:
        row_id = await p.row
        await self.recorder.end(row_id, {
            "status": "ok", "response_json": body, "completion_ids": comp.completion_ids,
            "logprobs": [None if math.isnan(v) else v for v in comp.logprobs],
            "tool_calls_json": [{"id": t.id, "name": t.name, "arguments": t.arguments}
                                for t in comp.tool_calls] if comp.tool_calls else None,
            "tool_parse_error": comp.tool_parse_error, "finish_reason": comp.finish_reason,
            "prompt_tokens": comp.prompt_tokens, "completion_tokens": comp.completion_tokens,
            "latency_ms": (time.perf_counter() - p.started) * 1000, "ended_at": utcnow(),
        })
        self.builder.record(p.rollout["id"], p.req.messages, p.req.prompt_tools, p.prompt, comp, row_id)

    async def record_error(self, p: Prepared, message: str, status: str = "error") -> None:
        try:
            row_id = await p.row
            await self.recorder.end(row_id, {"status": status, "error": message[:2000], "ended_at": utcnow(),
                                             "latency_ms": (time.perf_counter() - p.started) * 1000})
        except StoreError:
            pass  # the error being reported matters more than the failed bookkeeping

    # -- running -----------------------------------------------------------------------------

    async def slot(self) -> None:
        """Take one of `max_concurrent_calls` slots, queueing behind the calls that hold them; refuse
        (429, retryable) once 4x the limit are already queued: a harness retries later rather than
        piling up connections."""
        limit = self.config.max_concurrent_calls
        if self.pending >= 5 * limit:
            raise APIError("rate_limit", "the proxy is at its concurrent-call limit; retry shortly", retry_after=1.0)
        self.pending += 1
        try:
            await asyncio.wait_for(self.slots.acquire(), self.config.call_timeout_s)
        except TimeoutError:
            self.pending -= 1
            raise APIError("rate_limit", "waited too long for a free call slot; retry", retry_after=1.0) from None
        except BaseException:
            self.pending -= 1
            raise

    def release(self) -> None:
        self.pending -= 1
        self.slots.release()

    async def complete(self, p: Prepared) -> dict[str, Any]:
        """Non-streaming: the whole completion, recorded, as the API's response body."""
        try:
            comp = await asyncio.wait_for(p.generation.complete(), self.config.call_timeout_s)
            if p.generation.finish == "abort":
                raise EngineUnavailable("the engine aborted the request")
        except TimeoutError:
            await self.record_error(p, "call timed out")
            raise APIError("timeout", f"the call took over {self.config.call_timeout_s:g}s "
                           "(proxy.call_timeout_s); retry it", retry_after=1.0) from None
        except EngineError as exc:
            await self.record_error(p, str(exc))
            raise engine_error(exc) from None
        body = self.response_body(p, comp)
        await self.record_ok(p, comp, body)
        return body

    async def events(self, p: Prepared) -> AsyncIterator[TextDelta | ToolCallEvent | None]:
        """Streaming: events with the per-call deadline applied to each wait on the engine."""
        deadline = time.monotonic() + self.config.call_timeout_s
        agen = p.generation.events()
        try:
            while True:
                try:
                    ev = await asyncio.wait_for(agen.__anext__(), max(deadline - time.monotonic(), 0.001))
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    raise APIError("timeout", f"the call took over {self.config.call_timeout_s:g}s "
                                   "(proxy.call_timeout_s); retry it", retry_after=1.0) from None
                except EngineError as exc:
                    raise engine_error(exc) from None
                yield ev
            if p.generation.finish == "abort":
                raise engine_error(EngineUnavailable("the engine aborted the request"))
        finally:
            await agen.aclose()
