"""The life of one call, whatever its API, owned in one place:

    slot -> prompt ids (proxy/prompts.py) -> context check -> in-flight row -> engine
         -> the stream or the body (the adapter renders it) -> finished row -> slot released

`CallPipeline.run` returns the response. A streamed response carries its slot with it: the stream's
body gives the slot back when it ends, however it ends (finished, failed, or the client gone).
Engine failures become API errors by their type: retryable (timeout, engine down) or not (a request
the engine refused); a bug still answers in the API's shape, and every failure ends the call's row.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from starlette.responses import JSONResponse, Response, StreamingResponse

from openforge.engine.client import EngineClient
from openforge.config import ProxyConfig
from openforge.image_store import ImageError, ImageStore
from openforge.paths import forge_home
from openforge.errors import EngineError, EngineRejected, EngineTimeout, EngineUnavailable, StoreError
from openforge.store import CALL_CLIENT_LEFT, utcnow
from openforge.proxy.api_adapters import ApiAdapter
from openforge.proxy.calls import APIError, CallRequest, Completion, StreamEvent, bad_request, new_call_id
from openforge.proxy.generation import Generation, GenerationParams, token_logprobs
from openforge.proxy.image_inputs import slim_body
from openforge.proxy.parsing import ParserSetup
from openforge.proxy.prompts import PromptTooLong, RolloutPrompts, too_long
from openforge.proxy.recorder import Recorder
from openforge.proxy.slots import Slot, Slots
from openforge.proxy.teacher import Teacher, TeacherGeneration
from openforge.proxy.tokens import ChatRenderer, Prompt

log = logging.getLogger("forge.proxy")


class EventStream(StreamingResponse):
    """Starlette's StreamingResponse without its anyio task group (a cancel scope and two tasks per
    stream, the body written from the second): the body is written from the request's own task, and
    one plain asyncio task waits for the client to leave and then cancels it, so the body generator's
    `finally` runs as it did under the task group."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        writer = asyncio.current_task()
        assert writer is not None
        gone = False

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            writer.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not gone:  # the server is stopping, not the client leaving: let it through
                raise
            writer.uncancel()
        finally:
            watcher.cancel()


class JSONBody(JSONResponse):
    """A JSON response written by orjson: the same compact UTF-8 JSON as Starlette's `json.dumps`
    (a fifth of the time); what orjson cannot write (a non-string key, an int past 64 bits) goes
    the standard way."""

    def render(self, content: Any) -> bytes:
        try:
            return orjson.dumps(content)
        except (TypeError, orjson.JSONEncodeError):
            return super().render(content)


def engine_error(exc: EngineError) -> APIError:
    """An engine failure by its type. A timeout or an engine that is down is the caller's to retry; a
    request the engine refused (400) is not (Codex retries a 503 until it gives up); a refusal of the
    proxy itself (401/403/404: a wrong engine key or adapter) is the proxy's fault, a 500."""
    if isinstance(exc, EngineRejected):
        if exc.status == 400:
            return APIError("invalid_request", f"the inference engine refused this call: {exc}")
        return APIError("server", f"the inference engine refused the proxy: {exc}")
    kind = "timeout" if isinstance(exc, EngineTimeout) else "overloaded"
    return APIError(kind, f"the inference engine failed this call, retry it: {exc}", retry_after=1.0)


def call_timeout(seconds: float) -> APIError:
    return APIError("timeout", f"the call took over {seconds:g}s (proxy.call_timeout_s); retry it", retry_after=1.0)


@dataclass(frozen=True)
class Sampling:
    """The sampling parameters a call is served with, after any proxy override. Every one is sent
    explicitly: an engine may otherwise use the model's own defaults (SGLang can take them from
    generation_config.json), and the recorded values must be the ones the tokens were sampled at."""

    temperature: float
    top_p: float
    top_k: int  # -1 = the whole vocabulary (SGLang's convention)

    @classmethod
    def of(cls, req: CallRequest, config: ProxyConfig) -> Sampling:
        override = config.temperature_override
        if config.sampling == "run":  # the policy samples as RL needs, whatever the harness asked (its body has that)
            return cls(temperature=override if override is not None else 1.0, top_p=1.0, top_k=-1)
        return cls(temperature=override if override is not None else (req.temperature if req.temperature is not None
                                                                       else 1.0),
                   top_p=req.top_p if req.top_p is not None else 1.0, top_k=req.top_k or -1)


@dataclass
class LiveCall:
    """A call being served: its prompt, its in-flight row, and the engine generation behind it."""

    adapter: ApiAdapter
    rollout: dict[str, Any]
    req: CallRequest
    prompt: Prompt
    row: asyncio.Future  # -> the call row's id, once its in-flight insert is committed
    response_id: str
    model: str
    started: float
    generation: Generation | TeacherGeneration  # the engine's, or the teacher's (engine.kind = "remote")


class CallPipeline:
    def __init__(self, config: ProxyConfig, *, recorder: Recorder, engine: EngineClient | None, renderer: ChatRenderer,
                 served_model: str, home: Path | None = None, teacher: Teacher | None = None) -> None:
        self.config = config
        self.home = home  # the data dir: a call's images go to runs/<run id>/images/ under it
        self.recorder = recorder
        self.engine = engine
        self.teacher = teacher  # with a teacher, every call is the teacher's, re-tokenised for the student
        self.renderer = renderer
        self.served_model = served_model
        self.parsers = ParserSetup.resolve(config.tool_parser, config.reasoning_parser, renderer.template_text,
                                           strict=config.tool_parser_strict)
        self.prompts = RolloutPrompts(renderer, recorder, parsers=self.parsers, home=home)
        self.slots = Slots(config.max_concurrent_calls, queue_limit=5 * config.max_concurrent_calls,
                           wait_s=config.call_timeout_s)
        self._engine_context: int | None = None
        self._engine_asked = False
        self._background: set[asyncio.Future] = set()

    async def run(self, adapter: ApiAdapter, rollout: dict[str, Any], req: CallRequest, raw_body: str) -> Response:
        """Serve one parsed call; raises APIError (already recorded) for an answer in the API's shape."""
        # The row's started_at is the call's arrival, its wait for a slot included: the runner leaves the
        # time from there to ended_at out of the harness's time limit (rollouts/runner/policy_clock.py).
        arrived = utcnow()
        slot = await self.slots.take()
        try:
            call = await self._begin(adapter, rollout, req, raw_body, arrived)
            try:
                if req.stream:
                    return await self._start_stream(call, slot)
                return JSONBody(await self._complete(call))
            except APIError as err:
                await self._record_error(call, err.message)
                raise
            except StoreError as exc:
                raise APIError("server", f"the proxy could not record the call: {exc}") from None
            except Exception as exc:  # noqa: BLE001 - a bug must still answer in the API's shape, never hang
                log.exception("proxy: unexpected error in a %s call", req.api)
                err = APIError("server", f"internal proxy error: {type(exc).__name__}: {exc}")
                await self._record_error(call, err.message)
                raise err from None
        finally:
            slot.release()  # a no-op once a stream has taken the slot over

    async def context_limit(self) -> int | None:
        """The longest prompt + completion served: the engine's context (asked once), or
        `proxy.max_context_tokens` where that is lower (or the engine reports none)."""
        if not self._engine_asked:
            try:
                source = self.teacher if self.teacher is not None else self.engine
                assert source is not None
                self._engine_context = await source.context_length()
                self._engine_asked = True  # an answer, even "none": not asked again on every call
            except EngineError:
                pass  # asked again on the next call; the engine itself still refuses what is too long
        found = [n for n in (self._engine_context, self.config.max_context_tokens) if n is not None]
        return min(found) if found else None

    async def count_tokens(self, rollout_id: str, req: CallRequest, body_chars: int) -> int:
        self.check_images(req)
        return len((await self.prompts.build(rollout_id, req, limit=None, body_chars=body_chars)).ids)

    async def aclose(self) -> None:
        if self._background:  # streams being wound up still write their rows
            await asyncio.wait(list(self._background), timeout=10)

    # -- the call's start and end --------------------------------------------------------------

    def check_images(self, req: CallRequest) -> None:
        if self.renderer.vision is None and any(m.images for m in req.messages):
            raise bad_request(f"the model {self.served_model} does not take images (it has no image processor): "
                              "send text only, or serve a vision-language model", "messages")

    async def store_images(self, run_id: str, prompt: Prompt) -> list[str]:
        """Each image of the prompt stored once under the run (content-addressed); their ids in order."""
        if not prompt.images:
            return []
        store = ImageStore.for_run(self.home or forge_home(), run_id)
        try:
            await asyncio.to_thread(lambda: [store.put(im.data) for im in prompt.images])
        except (ImageError, OSError) as exc:
            raise APIError("server", f"the proxy could not store the call's images: {exc}") from None
        return [im.sha for im in prompt.images]

    async def _begin(self, adapter: ApiAdapter, rollout: dict[str, Any], req: CallRequest, raw_body: str,
                     arrived: datetime) -> LiveCall:
        self.check_images(req)
        limit = await self.context_limit()
        policy_turns = sum(1 for m in req.messages if m.role == "assistant")
        try:
            prompt = await self.prompts.build(rollout["id"], req, limit=limit, body_chars=len(raw_body))
        except PromptTooLong as exc:
            await self._record_refusal(rollout, req, raw_body, exc, policy_turns)
            raise
        image_ids = await self.store_images(rollout["run_id"], prompt)
        max_new = req.max_tokens or self.config.default_max_tokens
        if self.config.max_tokens_cap is not None:
            max_new = min(max_new, self.config.max_tokens_cap)
        if limit is not None:  # SGLang refuses prompt + max_new_tokens >= its context: cut to the room left
            max_new = min(max_new, limit - len(prompt.ids) - 1)
            if max_new < 1:
                refusal = too_long(len(prompt.ids), limit)
                await self._record_refusal(rollout, req, raw_body, refusal, policy_turns)
                raise refusal
        sampling = Sampling.of(req, self.config)
        model = req.model or self.served_model
        # The in-flight row is committed while the engine starts on the prompt (not before it): the
        # insert is off the critical path, and `row` is awaited before any byte of the answer goes out.
        row = asyncio.ensure_future(self.recorder.begin({
            "run_id": rollout["run_id"], "rollout_id": rollout["id"], "api": req.api, "model": model,
            "adapter": rollout.get("adapter"), "stream": req.stream,
            # each image as a reference to its file (proxy/image_inputs.py): a body holds no screenshot's bytes
            "request_json": slim_body(raw_body, prompt.images) if prompt.images else raw_body,
            "prompt_ids": prompt.ids, "reused_tokens": prompt.reused_tokens, "prompt_tokens": len(prompt.ids),
            "break_reason": prompt.break_reason, "images": image_ids or None, "policy_turns": policy_turns,
            "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
            "retokenized": self.teacher is not None, "started_at": arrived,
        }))
        engine_params: dict[str, Any] = {"max_new_tokens": max_new, "stop_token_ids": self.renderer.stop_token_ids,
                                         "temperature": sampling.temperature, "top_p": sampling.top_p,
                                         "top_k": sampling.top_k}
        if req.stop:
            engine_params["stop"] = req.stop
        params = GenerationParams(prompt.ids, engine_params, req.stop, rollout.get("adapter"),
                                  rid=new_call_id(rollout["id"]), id_prefix=adapter.TOOL_ID_PREFIX,
                                  parser=self.parsers.for_request(req, prompt_text=prompt.text,
                                                                  id_prefix=adapter.TOOL_ID_PREFIX),
                                  image_data=[im.data_url for im in prompt.images] or None,
                                  routing_key=rollout["id"])
        generation: Generation | TeacherGeneration
        if self.teacher is not None:
            generation = self.teacher.generation(self.renderer, req, prompt, max_tokens=max_new,
                                                 id_prefix=adapter.TOOL_ID_PREFIX)
        else:
            assert self.engine is not None
            generation = Generation(self.engine, self.renderer, params)
        return LiveCall(adapter, rollout, req, prompt, row, new_call_id(adapter.RESPONSE_ID_PREFIX), model,
                        time.perf_counter(), generation)

    async def _record_refusal(self, rollout: dict[str, Any], req: CallRequest, raw_body: str, refusal: PromptTooLong,
                              policy_turns: int) -> None:
        """A prompt refused as over the context, as a `refused` row: the runner tells the harness's own prompt
        (no answer of the policy in it: a configuration failure) from one the policy filled."""
        row_id = await self.recorder.begin({
            "run_id": rollout["run_id"], "rollout_id": rollout["id"], "api": req.api,
            "model": req.model or self.served_model, "adapter": rollout.get("adapter"), "stream": req.stream,
            "request_json": raw_body, "prompt_tokens": refusal.tokens, "policy_turns": policy_turns,
            "retokenized": self.teacher is not None, "started_at": utcnow()})
        await self.recorder.end(row_id, {"status": "refused", "error": refusal.message[:2000], "ended_at": utcnow()})

    def _body(self, call: LiveCall, comp: Completion) -> dict[str, Any]:
        lps = token_logprobs(self.renderer, comp) if call.req.logprobs else None
        return call.adapter.response_json(call.req, comp, call_id=call.response_id, model=call.model,
                                          token_logprobs=lps)

    async def _record_ok(self, call: LiveCall, comp: Completion, body: dict[str, Any]) -> None:
        row_id = await call.row
        await self.recorder.end(row_id, {
            "status": "ok", "response_json": body, "completion_ids": comp.completion_ids,
            "logprobs": [None if math.isnan(v) else v for v in comp.logprobs],
            "tool_calls_json": [{"id": t.id, "name": t.name, "arguments": t.arguments}
                                for t in comp.tool_calls] if comp.tool_calls else None,
            "tool_parse_error": comp.tool_parse_error, "finish_reason": comp.finish_reason,
            "prompt_tokens": comp.prompt_tokens, "completion_tokens": comp.completion_tokens,
            "latency_ms": (time.perf_counter() - call.started) * 1000, "ended_at": utcnow(),
            **call.generation.record,
        })
        self.prompts.remember(call.rollout["id"], call.req, call.prompt, comp, row_id)

    async def _record_error(self, call: LiveCall, message: str) -> None:
        try:
            row_id = await call.row
            await self.recorder.end(row_id, {"status": "error", "error": message[:2000], "ended_at": utcnow(),
                                             "latency_ms": (time.perf_counter() - call.started) * 1000,
                                             **call.generation.record})
        except StoreError:
            pass  # the error being reported matters more than the failed bookkeeping

    # -- a whole body ------------------------------------------------------------------------

    async def _complete(self, call: LiveCall) -> dict[str, Any]:
        try:
            comp = await asyncio.wait_for(call.generation.complete(), self.config.call_timeout_s)
        except TimeoutError:
            raise call_timeout(self.config.call_timeout_s) from None
        except EngineError as exc:
            raise engine_error(exc) from None
        if call.generation.finish == "abort":
            raise engine_error(EngineUnavailable("the engine aborted the request"))
        body = self._body(call, comp)
        await self._record_ok(call, comp, body)
        return body

    # -- a stream ----------------------------------------------------------------------------

    async def _start_stream(self, call: LiveCall, slot: Slot) -> Response:
        """Wait for the engine's first tokens before answering 200, so an engine that is down is a
        retryable error status rather than a stream that breaks."""
        events = self._events(call)
        try:
            await events.__anext__()
            await call.row  # the in-flight row is committed before the first byte
        except StopAsyncIteration:
            await events.aclose()
            raise APIError("overloaded", "the engine returned nothing; retry", retry_after=1.0) from None
        except BaseException:
            await events.aclose()
            raise
        return EventStream(self._stream_body(call, events, slot.hand_over()), media_type="text/event-stream",
                           headers={"cache-control": "no-cache", "x-accel-buffering": "no"})

    async def _events(self, call: LiveCall) -> AsyncIterator[list[StreamEvent] | None]:
        """The generation's events with the per-call deadline applied to each wait on the engine.

        The wait runs in this task (`asyncio.timeout`, not `wait_for`, which wraps it in a task of its
        own): when the client leaves, the cancellation reaches the engine stream directly, and closing
        it cannot find it still running in another task."""
        deadline = asyncio.get_running_loop().time() + self.config.call_timeout_s
        agen = call.generation.events()
        try:
            while True:
                try:
                    async with asyncio.timeout_at(deadline):
                        ev = await agen.__anext__()
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    raise call_timeout(self.config.call_timeout_s) from None
                except EngineError as exc:
                    raise engine_error(exc) from None
                yield ev
            if call.generation.finish == "abort":
                raise engine_error(EngineUnavailable("the engine aborted the request"))
        finally:
            await agen.aclose()

    async def _stream_body(self, call: LiveCall, events: AsyncIterator[Any], slot: Slot) -> AsyncIterator[str]:
        stream = call.adapter.Stream(call.req, call_id=call.response_id, model=call.model,
                                     prompt_tokens=len(call.prompt.ids))
        ended = False  # the row is finished (ok or error) and the stream's last event written
        try:
            # The lines of one engine chunk go out in one write (each write is a syscall and, with
            # TCP_NODELAY, a packet of its own).
            if start := "".join(stream.start()):
                yield start
            async for batch in events:
                if batch:
                    lines = "".join(line for ev in batch for line in stream.event(ev))
                    if lines:
                        yield lines
            comp = call.generation.completion
            assert comp is not None
            await self._record_ok(call, comp, self._body(call, comp))  # committed before the last chunk goes out
            ended = True
            lps = token_logprobs(self.renderer, comp) if call.req.logprobs else None
            if last := "".join(stream.finish(comp, lps)):
                yield last
        except (APIError, StoreError, Exception) as exc:  # noqa: BLE001 - a failure ends the stream in the API's shape
            err = self._stream_failure(call, exc)
            if not isinstance(exc, StoreError):
                await self._record_error(call, err.message)
            ended = True
            if failed := "".join(stream.error(err)):
                yield failed
        finally:
            # The slot is given back first and the rest runs as its own task: when the client went
            # away, this generator is cancelled, and every await here would be cancelled again.
            slot.release()
            task = asyncio.ensure_future(self._end_stream(call, events, ended))
            self._background.add(task)  # held: the loop keeps only weak references to tasks
            task.add_done_callback(self._background.discard)

    @staticmethod
    def _stream_failure(call: LiveCall, exc: Exception) -> APIError:
        if isinstance(exc, APIError):
            return exc
        if isinstance(exc, StoreError):
            return APIError("server", f"the proxy could not record the call: {exc}")
        log.exception("proxy: unexpected error while streaming a %s call", call.req.api, exc_info=exc)
        return APIError("server", f"internal proxy error: {type(exc).__name__}: {exc}")

    async def _end_stream(self, call: LiveCall, events: AsyncIterator[Any], ended: bool) -> None:
        await events.aclose()  # closes the engine request: SGLang aborts the generation
        if not ended:  # the client went away mid-stream: one line, not a traceback
            log.info("proxy: the client left a %s stream of rollout %s before it ended", call.req.api,
                     call.rollout["id"])
            await self._record_error(call, CALL_CLIENT_LEFT)
