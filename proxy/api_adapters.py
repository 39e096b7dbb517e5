"""What each API module provides: the `ApiAdapter` protocol, and the adapters by API name.

An adapter only translates. It turns the API's request JSON into the internal `CallRequest`, a
`Completion` into the API's response body or its stream of server-sent events, and an `APIError`
into the API's error body and status. Everything that must be the same for every API (slots,
prompt ids, the engine, recording) is the call pipeline's (proxy/pipeline.py).

The three API modules are adapters as they stand (a module satisfies a Protocol structurally):

    openai_chat        POST /v1/chat/completions   (OpenAI SDKs, OpenClaw)
    openai_responses   POST /v1/responses          (Codex)
    anthropic          POST /v1/messages           (Claude Code)
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from openforge.proxy import anthropic, openai_chat, openai_responses
from openforge.proxy.calls import APIError, CallRequest, Completion, StreamEvent


class ResponseStream(Protocol):
    """One streamed answer's events, as SSE lines: `start` before the first token, `event` per
    thinking or text delta and per tool call's start, argument delta and end, then `finish` (or `error` if the call fails midway)."""

    def start(self) -> list[str]: ...

    def event(self, ev: StreamEvent) -> list[str]: ...

    def finish(self, comp: Completion, token_logprobs: list[dict[str, Any]] | None = None) -> list[str]: ...

    def error(self, err: APIError) -> list[str]: ...


class StreamFactory(Protocol):
    def __call__(self, req: CallRequest, *, call_id: str, model: str, prompt_tokens: int) -> ResponseStream: ...


@runtime_checkable
class ApiAdapter(Protocol):
    API: str  # the `call.api` value its calls are recorded under
    RESPONSE_ID_PREFIX: str  # e.g. "chatcmpl": the response's id
    TOOL_ID_PREFIX: str  # e.g. "toolu": the ids of the tool calls it returns
    Stream: StreamFactory

    def parse_request(self, body: dict[str, Any]) -> CallRequest: ...

    def response_json(self, req: CallRequest, comp: Completion, *, call_id: str, model: str,
                      token_logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]: ...

    def error_json(self, err: APIError) -> dict[str, Any]: ...

    def error_status(self, err: APIError) -> int: ...


ADAPTERS: dict[str, ApiAdapter] = {m.API: m for m in (openai_chat, openai_responses, anthropic)}  # type: ignore[misc]


def adapter_for_path(path: str) -> ApiAdapter:
    """The API a path belongs to, for answers to requests that reach no endpoint (404, 405):
    Anthropic's paths answer in its shape, everything else in OpenAI's."""
    return anthropic if "/v1/messages" in path else openai_chat  # type: ignore[return-value]
