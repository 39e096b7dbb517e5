"""OpenAI Chat Completions (`POST /v1/chat/completions`) <-> the internal call shape.

Shapes follow the official `openai` SDK types (`ChatCompletion`, `ChatCompletionChunk`,
`ChatCompletionTokenLogprob`) and the API's error body `{"error": {message, type, param, code}}`.
"""

from __future__ import annotations

import time
from typing import Any

from openforge.proxy import image_inputs
from openforge.proxy.calls import (API_CHAT, APIError, CallRequest, Completion, Message, ReasoningDelta, StreamEvent, TextDelta,
                         ToolCall, ToolCallDelta, ToolCallStart, as_float, as_int, as_stop, bad_request, new_call_id,
                         parse_arguments, sse)

API = API_CHAT
RESPONSE_ID_PREFIX = "chatcmpl"
TOOL_ID_PREFIX = "call"
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
_ERROR_TYPE = {"invalid_request": "invalid_request_error", "context_length": "invalid_request_error",
               "authentication": "invalid_request_error", "permission": "permission_error",
               "not_found": "invalid_request_error", "not_allowed": "invalid_request_error",
               "too_large": "invalid_request_error", "rate_limit": "rate_limit_error",
               "overloaded": "server_error", "server": "server_error", "timeout": "server_error"}
_ERROR_CODE = {"authentication": "invalid_api_key", "context_length": "context_length_exceeded",
               "rate_limit": "rate_limit_exceeded", "too_large": "request_too_large"}


def error_json(err: APIError) -> dict[str, Any]:
    return {"error": {"message": err.message, "type": _ERROR_TYPE[err.kind], "param": err.param,
                      "code": _ERROR_CODE.get(err.kind)}}


def error_status(err: APIError) -> int:
    # OpenAI clients retry 5xx; 529 is Anthropic's, so overload is 503 here.
    return 503 if err.kind == "overloaded" else err.status


def parts_of(content: Any, where: str) -> tuple[str, list[Any] | None]:
    """Message content: a string, null, or a list of text and image parts (Chat's `image_url`,
    Responses' `input_image`, both as data URLs). Returns the text and, when there are images, the
    parts in order (text pieces and `ImageInput`s)."""
    if content is None:
        return "", None
    if isinstance(content, str):
        return content, None
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of content parts", where)
    parts: list[Any] = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("text", "input_text", "output_text") and isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif kind in ("image_url", "input_image"):
            parts.append(image_inputs.openai_part(part, f"{where}[{i}]"))
        elif kind in ("input_audio", "file", "input_file", "image"):
            raise bad_request(f"{where}[{i}]: {kind} parts are not supported (text and images only)", where)
        else:
            raise bad_request(f"{where}[{i}] must be a text or image part", where)
    text = "".join(p for p in parts if isinstance(p, str))
    return text, parts if any(not isinstance(p, str) for p in parts) else None


def text_of(content: Any, where: str) -> str:
    """Content that must be text (a system or assistant message)."""
    text, parts = parts_of(content, where)
    if parts is not None:
        raise bad_request(f"{where}: image parts are only allowed in user and tool messages", where)
    return text


def _message(raw: Any, i: int) -> Message:
    where = f"messages[{i}]"
    if not isinstance(raw, dict):
        raise bad_request(f"{where} must be an object", where)
    role = ROLES.get(raw.get("role"))  # type: ignore[arg-type]
    if role is None:
        raise bad_request(f"{where}.role must be one of {', '.join(ROLES)}", f"{where}.role")
    if role in ("user", "tool"):
        text, parts = parts_of(raw.get("content"), f"{where}.content")
    else:
        text, parts = text_of(raw.get("content"), f"{where}.content"), None
    msg = Message(role=role, content=text, parts=parts)  # type: ignore[arg-type]
    # The thinking a client sends back (SGLang's and vLLM's `reasoning_content`; some send `reasoning`).
    thinking = raw.get("reasoning_content", raw.get("reasoning")) if role == "assistant" else None
    if isinstance(thinking, str):
        msg.reasoning = thinking
    if role == "assistant" and raw.get("tool_calls"):
        calls = raw["tool_calls"]
        if not isinstance(calls, list):
            raise bad_request(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
        for j, tc in enumerate(calls):
            fn = tc.get("function") if isinstance(tc, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise bad_request(f"{where}.tool_calls[{j}].function.name is required", f"{where}.tool_calls")
            args = parse_arguments(fn.get("arguments", "{}"), f"{where}.tool_calls[{j}].function.arguments")
            msg.tool_calls.append(ToolCall(name=fn["name"], arguments=args, id=str(tc.get("id") or new_call_id())))
    if role == "tool":
        msg.tool_call_id = str(raw.get("tool_call_id") or "")
    if isinstance(raw.get("name"), str) and role == "tool":
        msg.name = raw["name"]
    return msg


def parse_tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise bad_request("'tools' must be a list", "tools")
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str):
            raise bad_request(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}", "tools")
        spec = {"name": fn["name"], "description": str(fn.get("description") or ""),
                "parameters": fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}}
        out.append({"type": "function", "function": spec})
    return out


def parse_request(body: dict[str, Any]) -> CallRequest:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list", "messages")
    n = as_int(body, "n", low=1)
    if n not in (None, 1):
        raise bad_request("only n=1 is supported (sample more rollouts instead)", "n")
    opts = body.get("stream_options") if isinstance(body.get("stream_options"), dict) else {}
    return CallRequest(
        api=API_CHAT,
        model=str(body.get("model") or ""),
        messages=[_message(m, i) for i, m in enumerate(messages)],
        tools=parse_tools(body.get("tools")),
        tool_choice=_tool_choice(body.get("tool_choice")),
        max_tokens=as_int(body, "max_completion_tokens", low=1) or as_int(body, "max_tokens", low=1),
        temperature=as_float(body, "temperature", low=0, high=2),
        top_p=as_float(body, "top_p", low=0, high=1),
        top_k=as_int(body, "top_k", low=1),
        stop=as_stop(body.get("stop")),
        stream=bool(body.get("stream")),
        include_usage=bool(opts.get("include_usage")),
        logprobs=bool(body.get("logprobs")),
        top_logprobs=as_int(body, "top_logprobs", low=0, high=20) or 0,
        seed=as_int(body, "seed", low=-(2**63)),
    )


def _tool_choice(value: Any) -> Any:
    if value is None or value in ("auto", "none", "required"):
        return value or "auto"
    if isinstance(value, dict) and isinstance(value.get("function"), dict):
        return {"name": value["function"].get("name")}
    raise bad_request("'tool_choice' must be 'auto', 'none', 'required' or a function", "tool_choice")


def _tool_call_json(tc: ToolCall, index: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"id": tc.id, "type": "function",
                           "function": {"name": tc.name, "arguments": tc.arguments_json}}
    if index is not None:
        out = {"index": index, **out}
    return out


def _usage(comp: Completion) -> dict[str, Any]:
    usage: dict[str, Any] = {"prompt_tokens": comp.prompt_tokens, "completion_tokens": comp.completion_tokens,
                             "total_tokens": comp.prompt_tokens + comp.completion_tokens}
    if comp.reasoning_tokens:
        usage["completion_tokens_details"] = {"reasoning_tokens": comp.reasoning_tokens}
    return usage


def response_json(req: CallRequest, comp: Completion, *, call_id: str, model: str,
                  token_logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": comp.text if comp.text or not comp.tool_calls else None,
                               "refusal": None}
    if comp.reasoning:
        message["reasoning_content"] = comp.reasoning  # SGLang's and vLLM's field for the thinking
    if comp.tool_calls:
        message["tool_calls"] = [_tool_call_json(tc) for tc in comp.tool_calls]
    choice = {"index": 0, "message": message, "finish_reason": comp.finish_reason,
              "logprobs": {"content": token_logprobs, "refusal": None} if req.logprobs else None}
    return {"id": call_id, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [choice], "usage": _usage(comp), "system_fingerprint": None}


class Stream:
    """The chunk sequence of a streamed chat completion: a role chunk, content / tool-call deltas,
    a finish chunk, a usage chunk when `stream_options.include_usage`, then `[DONE]`."""

    def __init__(self, req: CallRequest, *, call_id: str, model: str, **_: Any) -> None:
        self.req = req
        self.base = {"id": call_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
                     "system_fingerprint": None}

    def _chunk(self, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> str:
        chunk: dict[str, Any] = {**self.base, "choices": [
            {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}
        if self.req.include_usage:
            chunk["usage"] = None
        return sse(chunk)

    def start(self) -> list[str]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def event(self, ev: StreamEvent) -> list[str]:
        if isinstance(ev, TextDelta):
            return [self._chunk({"content": ev.text})]
        if isinstance(ev, ReasoningDelta):
            return [self._chunk({"reasoning_content": ev.text})]
        if isinstance(ev, ToolCallStart):  # OpenAI's shape: id, type and name first, then argument pieces
            return [self._chunk({"tool_calls": [{"index": ev.index, "id": ev.id, "type": "function",
                                                 "function": {"name": ev.name, "arguments": ""}}]})]
        if isinstance(ev, ToolCallDelta):
            return [self._chunk({"tool_calls": [{"index": ev.index, "function": {"arguments": ev.arguments}}]})]
        return []  # the end of a call has no chunk of its own

    def finish(self, comp: Completion, token_logprobs: list[dict[str, Any]] | None = None) -> list[str]:
        lp = {"content": token_logprobs, "refusal": None} if self.req.logprobs else None
        out = [self._chunk({}, comp.finish_reason, lp)]
        if self.req.include_usage:
            out.append(sse({**self.base, "choices": [], "usage": _usage(comp)}))
        out.append(sse("[DONE]"))
        return out

    def error(self, err: APIError) -> list[str]:
        return [sse(error_json(err))]
