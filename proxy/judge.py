"""The run's own engine as a task's judge (`judge.endpoint = "policy-base"`): `POST /judge/v1/chat/completions`.

    runner, agent gone -> rollout key replaced by a judge key (openforge.store.new_judge_key)
      -> POST /judge/v1/chat/completions  (Authorization: Bearer forge-judge-...)
      -> the engine with its base weights (no lora_path) -> a `judgement` row -> the Chat Completions body,
         the row's id in `x-forge-judgement`; the runner parses the reply and adds the score to that row

A judge call is no policy call: it is served without the rollout's adapter (the judge is the model the
run started from, whatever adapter the policy samples with), recorded in the `judgement` table and never
in `call` (no seq in the rollout, no trajectory reads it), and its prompt is rendered whole by a builder
of its own, so the policy's token reuse never sees it.

Who may call it: only a live rollout's judge key, which the runner makes once the agent is gone (so the
agent, which held its rollout's key while it ran, never saw it); the policy routes refuse judge keys
(proxy/app.py). A failed call (the engine's error, a timeout, a prompt too long) is recorded too, with
why, and answered as an error: the runner counts it as a judge failure, never a score.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

from starlette.responses import JSONResponse, Response

from openforge.errors import EngineError, StoreError
from openforge.proxy import openai_chat
from openforge.proxy.calls import APIError, CallRequest, Completion, new_call_id
from openforge.proxy.generation import Generation, GenerationParams
from openforge.proxy.image_inputs import REFERENCE, openai_part
from openforge.proxy.pipeline import CallPipeline, engine_error
from openforge.proxy.prompts import LONG_TEXT, too_long
from openforge.proxy.tokens import Prompt, PromptBuilder
from openforge.store import JUDGEMENT_HEADER, Judgement, Store

BASE_WEIGHTS = "policy-base"
_LEDGER = "judge"  # the judge's builder records no turn: every prompt is rendered whole


def recorded_messages(messages: Any) -> Any:
    """The judge's messages as the store keeps them: each image's data URL replaced by
    `forge-image:<sha256>`, the run's image file (as rollouts/tasks/judge.py records a judge's prompt)."""
    if not isinstance(messages, list):
        return None
    out = []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            content = [{"type": "image_url", "image_url": {"url": REFERENCE + openai_part(part, f"messages[{i}]").sha}}
                       if isinstance(part, dict) and part.get("type") == "image_url" else part for part in content]
            message = {**message, "content": content}
        out.append(message)
    return out


class JudgeRoute:
    """Serves and records judge calls on the pipeline's engine, renderer, slots and parsers."""

    def __init__(self, pipeline: CallPipeline, *, store_path: str | Path) -> None:
        self.pipeline = pipeline
        self.builder = PromptBuilder(pipeline.renderer)
        self.store_path = store_path
        self._store: Store | None = None  # opened on the first judgement (a sync Store, used off the loop)
        self._opening = threading.Lock()

    @property
    def model(self) -> str:
        return f"{BASE_WEIGHTS} ({self.pipeline.served_model})"

    async def serve(self, rollout: dict[str, Any], body: dict[str, Any], raw: str, *, timeout_s: float) -> Response:
        started = time.perf_counter()
        # The messages are recorded once they parse (each image then a reference, never its bytes).
        row: dict[str, Any] = {"run_id": rollout["run_id"], "rollout_id": rollout["id"], "model": self.model,
                               "prompt_json": None}
        try:
            req = openai_chat.parse_request(body)
            row["prompt_json"] = recorded_messages(body["messages"])
            comp = await self._generate(rollout, req, len(raw), timeout_s)
        except APIError as err:
            return await self._answer(row, started, err=err)
        body_out = openai_chat.response_json(req, comp, call_id=new_call_id("chatcmpl"), model=self.model)
        return await self._answer(row, started, reply=comp.text, body=body_out)

    async def _generate(self, rollout: dict[str, Any], req: CallRequest, body_chars: int,
                        timeout_s: float) -> Completion:
        pipeline = self.pipeline
        if pipeline.engine is None:
            raise APIError("server", "the policy-base judge needs the run's own engine, and this proxy has none "
                                     "(engine.kind = \"remote\")")
        pipeline.check_images(req)
        try:  # the whole call, a wait for a slot included, ends within the caller's limit (and is recorded)
            async with asyncio.timeout(timeout_s):
                return await self._generate_in_slot(rollout, req, body_chars)
        except TimeoutError:  # the runner's judge.timeout_s, or proxy.call_timeout_s when that is lower
            raise APIError("timeout", f"the judge's call took over {timeout_s:g}s") from None

    async def _generate_in_slot(self, rollout: dict[str, Any], req: CallRequest, body_chars: int) -> Completion:
        pipeline = self.pipeline
        assert pipeline.engine is not None
        slot = await pipeline.slots.take()
        try:
            limit = await pipeline.context_limit()
            prompt = await self._prompt(req, body_chars)
            if limit is not None and len(prompt.ids) + 1 >= limit:
                raise too_long(len(prompt.ids), limit)
            await pipeline.store_images(rollout["run_id"], prompt)  # the record's forge-image references
            max_new = req.max_tokens or pipeline.config.default_max_tokens
            if pipeline.config.max_tokens_cap is not None:
                max_new = min(max_new, pipeline.config.max_tokens_cap)
            if limit is not None:
                max_new = min(max_new, limit - len(prompt.ids) - 1)
            sampling = {"max_new_tokens": max_new, "stop_token_ids": pipeline.renderer.stop_token_ids,
                        # the caller's own sampling: proxy.temperature_override is the policy's, not the judge's
                        "temperature": req.temperature if req.temperature is not None else 1.0,
                        "top_p": req.top_p if req.top_p is not None else 1.0, "top_k": req.top_k or -1}
            if req.stop:
                sampling["stop"] = req.stop
            params = GenerationParams(prompt.ids, sampling, req.stop, None,  # no lora_path: the base weights
                                      rid=new_call_id("judge"),
                                      parser=pipeline.parsers.for_request(req, prompt_text=prompt.text),
                                      image_data=[im.data_url for im in prompt.images] or None,
                                      routing_key=rollout["id"])
            try:
                return await Generation(pipeline.engine, pipeline.renderer, params).complete()
            except EngineError as exc:
                raise engine_error(exc) from None
        finally:
            slot.release()

    async def _prompt(self, req: CallRequest, body_chars: int) -> Prompt:
        if body_chars > LONG_TEXT:
            return await asyncio.to_thread(self.builder.build, _LEDGER, req.messages, req.prompt_tools)
        return self.builder.build(_LEDGER, req.messages, req.prompt_tools)

    async def _answer(self, row: dict[str, Any], started: float, *, err: APIError | None = None,
                      reply: str | None = None, body: dict[str, Any] | None = None) -> Response:
        row.update(reply=reply, error=err.message[:2000] if err is not None else None,
                   latency_ms=(time.perf_counter() - started) * 1000)
        try:
            judgement_id = await asyncio.to_thread(self._record, row)
        except StoreError as exc:  # unrecorded: the runner records the failure itself (no id comes back)
            err = APIError("server", f"the proxy could not record the judgement: {exc}")
            return JSONResponse(openai_chat.error_json(err), status_code=openai_chat.error_status(err))
        headers = {JUDGEMENT_HEADER: str(judgement_id)}
        if err is not None:
            return JSONResponse(openai_chat.error_json(err), status_code=openai_chat.error_status(err), headers=headers)
        return JSONResponse(body, headers=headers)

    def _record(self, row: dict[str, Any]) -> int:
        with self._opening:
            if self._store is None:
                self._store = Store(self.store_path)
        judgement = self._store.add_judgement(Judgement(**row))
        assert judgement.id is not None
        return judgement.id

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
