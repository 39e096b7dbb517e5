"""A teacher behind the proxy (`engine.kind = "remote"`): each call goes to an OpenAI-compatible or
Anthropic endpoint, and is recorded in the student's tokens.

    CallRequest --(upstream_body: OpenAI chat or Anthropic messages JSON)--> upstream (non-streaming)
        --(parse_reply)--> text, tool calls, thinking
        --(the student's chat template renders them as the assistant turn)--> completion ids

No teacher returns token ids, so the completion's ids are the student's tokenisation of the student's
chat template rendering of the answer (tool calls in the student's format): prompt ids + completion
ids decode to `render(messages + [answer])` up to the end-of-turn token. The row says so
(`call.retokenized`) and has no logprobs. The upstream is always asked for a whole answer; a harness
that asked for a stream gets one rendered from it by its API's own stream writer, as an engine's
tokens would be.

Upstream failures: 429, 5xx, 529 and connection errors are retried with exponential backoff (the
upstream's `Retry-After` honoured, up to `max_backoff_s`), each retry counted on the call's row
(`call.upstream_retries`); when the retries are spent the call fails as the engine's would (a 503 /
529 the harness may retry, the row `error`). A refused key (401/403) or request (400) is not retried.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from openforge.config import RemoteEngineConfig
from openforge.errors import ConfigError, EngineRejected, EngineTimeout, EngineUnavailable
from openforge.proxy.calls import (APIError, CallRequest, Completion, Message, ReasoningDelta, StreamEvent, TextDelta,
                                   ToolCall, ToolCallDelta, ToolCallEvent, ToolCallStart, new_call_id)
from openforge.proxy.tokens import ChatRenderer, Prompt

RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
ANTHROPIC_VERSION = "2023-06-01"


class UpstreamFailed(EngineUnavailable):
    """The upstream failed the call after every retry (an engine that is down, to the pipeline)."""


def upstream_key(config: RemoteEngineConfig) -> str:
    """The key from the environment variable `engine.api_key_env` names (the config never holds it)."""
    if not config.api_key_env:
        return ""
    key = os.environ.get(config.api_key_env, "")
    if not key:
        raise ConfigError(f"engine.api_key_env = {config.api_key_env!r}, but that environment variable is not set: "
                          f"export {config.api_key_env}=<the upstream's key>")
    return key


def check_teacher_config(config: RemoteEngineConfig) -> None:
    """ConfigError, with the fix, for a remote engine that cannot work: before any rollout starts."""
    if not config.url:
        raise ConfigError("engine.kind = \"remote\" needs engine.url (e.g. https://api.anthropic.com)")
    if not config.upstream_model:
        raise ConfigError("engine.kind = \"remote\" needs engine.upstream_model: the teacher's model id upstream")
    upstream_key(config)


# -- the request, in the upstream's API ----------------------------------------------------------


def _openai_message(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role}
    if m.images:
        out["content"] = [{"type": "text", "text": p} if isinstance(p, str)
                          else {"type": "image_url", "image_url": {"url": p.data_url}} for p in m.parts or []]
    else:
        out["content"] = m.content
    if m.tool_calls:
        out["tool_calls"] = [{"id": tc.id, "type": "function",
                              "function": {"name": tc.name, "arguments": tc.arguments_json}} for tc in m.tool_calls]
        out["content"] = m.content or None
    if m.role == "tool":
        out["tool_call_id"] = m.tool_call_id or ""
    return out


def _openai_tool_choice(choice: Any) -> Any:
    return {"type": "function", "function": {"name": choice["name"]}} if isinstance(choice, dict) else choice


def _anthropic_blocks(m: Message) -> list[dict[str, Any]]:
    if not m.images:
        return [{"type": "text", "text": m.content}] if m.content else []
    return [{"type": "text", "text": p} if isinstance(p, str) else
            {"type": "image", "source": {"type": "base64", "media_type": f"image/{p.format}",
                                         "data": base64.b64encode(p.data).decode("ascii")}}
            for p in m.parts or [] if not isinstance(p, str) or p]


def _anthropic_messages(messages: list[Message]) -> tuple[str, list[dict[str, Any]]]:
    """(system, messages): leading system turns become `system`; a later one a user text block (the
    Messages API has no system role in `messages`); tool results go in a user turn, and consecutive
    turns of one role are merged (the API wants them alternating)."""
    system: list[str] = []
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if out and out[-1]["role"] == role:
            out[-1]["content"] += blocks
        else:
            out.append({"role": role, "content": blocks})

    for m in messages:
        if m.role == "system" and not out:
            system.append(m.content)
        elif m.role == "system":
            add("user", [{"type": "text", "text": m.content}])
        elif m.role == "tool":
            result = _anthropic_blocks(m) or [{"type": "text", "text": ""}]
            add("user", [{"type": "tool_result", "tool_use_id": m.tool_call_id or "", "content": result}])
        elif m.role == "assistant":
            blocks = [{"type": "text", "text": m.content}] if m.content else []
            blocks += [{"type": "tool_use", "id": tc.id, "name": tc.name, "input": tc.arguments} for tc in m.tool_calls]
            add("assistant", blocks or [{"type": "text", "text": ""}])
        else:
            add("user", _anthropic_blocks(m) or [{"type": "text", "text": ""}])
    return "\n\n".join(system), out


def _anthropic_tool_choice(choice: Any) -> dict[str, Any]:
    if isinstance(choice, dict):
        return {"type": "tool", "name": choice["name"]}
    return {"type": {"required": "any", "none": "none"}.get(choice, "auto")}


def upstream_body(req: CallRequest, config: RemoteEngineConfig, max_tokens: int) -> dict[str, Any]:
    """The call as the upstream's API asks for it (never streamed: the proxy renders its own stream)."""
    body: dict[str, Any] = {"model": config.upstream_model, "max_tokens": max_tokens, "stream": False}
    if req.temperature is not None:
        body["temperature"] = req.temperature
    if req.top_p is not None:
        body["top_p"] = req.top_p
    if config.api == "anthropic":
        system, messages = _anthropic_messages(req.messages)
        body["messages"] = messages
        if system:
            body["system"] = system
        if req.tools:
            body["tools"] = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
                              "input_schema": t["function"].get("parameters") or {"type": "object"}}
                             for t in req.tools]
            body["tool_choice"] = _anthropic_tool_choice(req.tool_choice)
        if req.top_k:
            body["top_k"] = req.top_k
        if req.stop:
            body["stop_sequences"] = req.stop
        return body
    body["messages"] = [_openai_message(m) for m in req.messages]
    if req.tools:
        body["tools"] = req.tools
        body["tool_choice"] = _openai_tool_choice(req.tool_choice)
    if req.stop:
        body["stop"] = req.stop
    if req.seed is not None:
        body["seed"] = req.seed
    return body


# -- the reply ------------------------------------------------------------------------------------


@dataclass
class TeacherReply:
    text: str
    tool_calls: list[ToolCall]
    reasoning: str = ""
    cut: bool = False  # the upstream stopped at max_tokens
    stop_sequence: str | None = None


def _arguments(raw: Any) -> tuple[dict[str, Any], str | None]:
    if isinstance(raw, dict):
        return raw, None
    try:
        value = json.loads(raw) if isinstance(raw, str) and raw.strip() else {}
    except json.JSONDecodeError:
        raise UpstreamShapeError(f"the upstream returned tool-call arguments that are not JSON: {raw!r:.200}") from None
    if not isinstance(value, dict):
        raise UpstreamShapeError(f"the upstream returned tool-call arguments that are not an object: {raw!r:.200}")
    return value, raw


class UpstreamShapeError(EngineRejected):
    """The upstream's answer is not the configured API's (or is malformed): retrying cannot help."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=502)


def parse_reply(data: Any, api: str, id_prefix: str) -> TeacherReply:
    """The upstream's JSON answer -> text, tool calls (new ids, in the calling API's style), thinking."""
    if not isinstance(data, dict):
        raise UpstreamShapeError("the upstream's answer is not a JSON object")
    if api == "anthropic":
        if data.get("type") != "message" or not isinstance(data.get("content"), list):
            other = " (it looks like an OpenAI chat completion: set engine.api = \"openai\")" if "choices" in data else ""
            raise UpstreamShapeError(f"the upstream's answer is not an Anthropic message{other}")
        text, thinking, calls = [], [], []
        for block in data["content"]:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                text.append(str(block.get("text", "")))
            elif kind == "thinking":
                thinking.append(str(block.get("thinking", "")))
            elif kind == "tool_use":
                args, _ = _arguments(block.get("input"))
                calls.append(ToolCall(name=str(block.get("name", "")), arguments=args, id=new_call_id(id_prefix)))
        reason = data.get("stop_reason")
        return TeacherReply("".join(text), calls, "".join(thinking), cut=reason == "max_tokens",
                            stop_sequence=data.get("stop_sequence") if reason == "stop_sequence" else None)
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        other = " (it looks like an Anthropic message: set engine.api = \"anthropic\")" if data.get("type") == "message" \
            else ""
        raise UpstreamShapeError(f"the upstream's answer is not an OpenAI chat completion{other}")
    msg = choices[0].get("message") or {}
    calls = []
    for tc in msg.get("tool_calls") or []:
        fn = tc.get("function") or {}
        args, raw = _arguments(fn.get("arguments"))
        calls.append(ToolCall(name=str(fn.get("name", "")), arguments=args, id=new_call_id(id_prefix),
                              raw_arguments=raw))
    thinking = msg.get("reasoning_content") or msg.get("reasoning") or ""
    content = msg.get("content")
    if isinstance(content, list):  # some servers answer in parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return TeacherReply(content or "", calls, thinking if isinstance(thinking, str) else "",
                        cut=choices[0].get("finish_reason") == "length")


# -- the client -----------------------------------------------------------------------------------


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: the backoff decides


class Teacher:
    """The upstream endpoint: one call at a time per request, retried as the module docstring says."""

    def __init__(self, config: RemoteEngineConfig, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.config = config
        key = upstream_key(config)
        headers = {"content-type": "application/json"}
        if config.api == "anthropic":
            headers["anthropic-version"] = ANTHROPIC_VERSION
            if key:
                headers["x-api-key"] = key
        elif key:
            headers["authorization"] = f"Bearer {key}"
        self.url = config.url.rstrip("/") + ("/v1/messages" if config.api == "anthropic" else "/v1/chat/completions")
        self.client = httpx.AsyncClient(headers=headers, timeout=config.request_timeout_s, transport=transport)

    async def context_length(self) -> int | None:
        return None  # the student's context is the proxy's limit (proxy.max_context_tokens)

    async def aclose(self) -> None:
        await self.client.aclose()

    def backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.config.max_backoff_s)
        wait = self.config.backoff_s * (2 ** attempt)
        return min(wait * (0.5 + random.random() / 2), self.config.max_backoff_s)  # jitter: not all at once

    async def ask(self, body: dict[str, Any], attempts: list[str]) -> Any:
        """The upstream's JSON answer; each failed try appended to `attempts` (why it failed)."""
        for attempt in range(self.config.max_retries + 1):
            retry_after = None
            try:
                response = await self.client.post(self.url, json=body)
            except httpx.TimeoutException as exc:
                why = f"timeout: {type(exc).__name__}"
            except httpx.HTTPError as exc:
                why = f"unreachable: {type(exc).__name__}: {exc}"
            else:
                if response.status_code == 200:
                    try:
                        return response.json()
                    except ValueError:
                        raise UpstreamShapeError("the upstream's answer is not JSON") from None
                detail = response.text[:300]
                if response.status_code in (401, 403):
                    raise EngineRejected(f"the upstream refused the key (HTTP {response.status_code}; "
                                         f"engine.api_key_env = {self.config.api_key_env!r}): {detail}",
                                         status=response.status_code)
                if response.status_code not in RETRY_STATUS:
                    raise EngineRejected(f"the upstream refused the call (HTTP {response.status_code}): {detail}",
                                         status=400 if response.status_code in (400, 404, 413, 422) else 500)
                why = f"HTTP {response.status_code}: {detail}"
                retry_after = _retry_after(response)
            attempts.append(why)
            if attempt < self.config.max_retries:
                await asyncio.sleep(self.backoff(attempt, retry_after))
        last = attempts[-1] if attempts else "no answer"
        kind = EngineTimeout if last.startswith("timeout") else UpstreamFailed
        raise kind(f"the upstream failed the call {len(attempts)} time(s) ({self.config.max_retries} retries); "
                   f"last: {last}")

    def generation(self, renderer: ChatRenderer, req: CallRequest, prompt: Prompt, *, max_tokens: int,
                   id_prefix: str) -> TeacherGeneration:
        return TeacherGeneration(self, renderer, req, prompt, max_tokens=max_tokens, id_prefix=id_prefix)


def call_backends(*, engine_url: str, engine_key: str | None, teacher: dict[str, Any] | None,
                  timeout: float) -> tuple[Any, Teacher | None]:
    """(the engine client, None), or (None, the teacher) where `teacher` is a remote engine's config
    (JSON): what `create_app` takes, for one proxy process or each of many (proxy/workers.py)."""
    if teacher is not None:
        return None, Teacher(RemoteEngineConfig.model_validate(teacher))
    from openforge.engine.client import EngineClient

    return EngineClient(engine_url, timeout=timeout, api_key=engine_key), None


# -- one call -------------------------------------------------------------------------------------


def retokenize(renderer: ChatRenderer, req: CallRequest, prompt: Prompt, answer: Message, *, cut: bool) -> list[int]:
    """The student's ids for `answer` as the assistant turn after `req`'s prompt: the student's chat
    template renders messages + answer, and what follows the prompt's text up to the end-of-turn token
    (included, unless the teacher was cut off) is tokenised."""
    full = renderer.render(req.messages + [answer], req.prompt_tools, generation=False)
    if not full.startswith(prompt.text):
        raise APIError("server", "the student's chat template renders the teacher's answer after a different prompt "
                       "than the one recorded; it cannot be re-tokenised")
    turn = full[len(prompt.text):]
    end = turn.rfind(renderer.eot_text)
    if end >= 0:
        turn = turn[:end] if cut else turn[:end + len(renderer.eot_text)]
    return renderer.encode(turn)


@dataclass
class TeacherGeneration:
    """One call answered by the teacher, with the same face as `proxy.generation.Generation`."""

    teacher: Teacher
    renderer: ChatRenderer
    req: CallRequest
    prompt: Prompt
    max_tokens: int
    id_prefix: str
    finish: str | None = None
    completion: Completion | None = None
    attempts: list[str] = field(default_factory=list)

    @property
    def record(self) -> dict[str, Any]:
        """What the call's row holds beyond an engine call's: the ids are the student's, no logprobs."""
        return {"retokenized": True, "upstream_retries": len(self.attempts), "logprobs": None}

    async def complete(self) -> Completion:
        body = upstream_body(self.req, self.teacher.config, self.max_tokens)
        reply = parse_reply(await self.teacher.ask(body, self.attempts), self.teacher.config.api, self.id_prefix)
        answer = Message("assistant", reply.text, tool_calls=reply.tool_calls, reasoning=reply.reasoning)
        ids = await asyncio.to_thread(retokenize, self.renderer, self.req, self.prompt, answer, cut=reply.cut)
        self.finish = "length" if reply.cut else "stop"
        reason = "length" if reply.cut else "tool_calls" if reply.tool_calls else "stop"
        self.completion = Completion(text=reply.text, tool_calls=reply.tool_calls, finish_reason=reason,
                                     completion_ids=ids, logprobs=[float("nan")] * len(ids),
                                     prompt_tokens=len(self.prompt.ids), stop_sequence=reply.stop_sequence,
                                     reasoning=reply.reasoning)
        return self.completion

    async def events(self) -> AsyncIterator[list[StreamEvent] | None]:
        """The whole answer first (a failing upstream is an error status, not a broken stream), then
        its events as the engine's parser would have given them."""
        comp = await self.complete()
        yield None
        events: list[StreamEvent] = []
        if comp.reasoning:
            events.append(ReasoningDelta(comp.reasoning))
        if comp.text:
            events.append(TextDelta(comp.text))
        for i, tc in enumerate(comp.tool_calls):
            events += [ToolCallStart(i, tc.id, tc.name), ToolCallDelta(i, tc.arguments_json), ToolCallEvent(i, tc)]
        if events:
            yield events
