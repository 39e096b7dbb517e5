"""Anthropic Messages (`POST /v1/messages`, what Claude Code speaks) <-> the internal call shape.

Shapes follow the official `anthropic` SDK types (`Message`, `RawMessageStreamEvent` and its
members, `ErrorResponse`). Content blocks map onto chat-template messages like this:

    system (str | text blocks)            -> a system message (also a `role: "system"` message, which
                                             Claude Code sends mid-conversation)
    user: text blocks                     -> a user message
    user: image blocks (base64 sources)   -> images of the user message, in place among its text
    user: tool_result blocks              -> one tool message each (before the user's text); their
                                             image blocks (a computer-use screenshot) stay in them
    assistant: text + tool_use blocks     -> an assistant message with tool calls
    assistant: thinking blocks            -> its reasoning (the template decides whether it renders it)
    redacted_thinking                     -> dropped (there is no text to render)
    image with a url/file source          -> a clear error: the proxy never fetches for a sandbox
    document / search_result              -> a clear error: the served model reads text and images
"""

from __future__ import annotations

import hashlib
from typing import Any

from openforge.proxy import image_inputs
from openforge.proxy.calls import (API_ANTHROPIC, APIError, CallRequest, Completion, Message, ReasoningDelta, StreamEvent,
                         TextDelta, ToolCall, ToolCallDelta, ToolCallStart, as_float, as_int, as_stop, bad_request,
                         parse_arguments, sse)

API = API_ANTHROPIC
RESPONSE_ID_PREFIX = "msg"
TOOL_ID_PREFIX = "toolu"
_ERROR_TYPE = {"invalid_request": "invalid_request_error", "context_length": "invalid_request_error",
               "authentication": "authentication_error", "permission": "permission_error",
               "not_found": "not_found_error", "not_allowed": "invalid_request_error", "too_large": "request_too_large",
               "rate_limit": "rate_limit_error", "overloaded": "overloaded_error", "server": "api_error",
               "timeout": "timeout_error"}
_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_SKIPPED = ("thinking", "redacted_thinking")
_UNSUPPORTED = ("document", "search_result", "container_upload")


def error_json(err: APIError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": _ERROR_TYPE[err.kind], "message": err.message}}


def error_status(err: APIError) -> int:
    return err.status


def _text(content: Any, where: str) -> str:
    """A system's content: a string or a list of text blocks."""
    text, parts = _parts(content, where)
    if parts is not None:
        raise bad_request(f"{where}: image blocks are only allowed in user messages and tool results", where)
    return text


def _parts(content: Any, where: str) -> tuple[str, list[Any] | None]:
    """A tool_result's content: a string or a list of text and image blocks. Returns the text and,
    when there are images, the blocks in order (text pieces, `ImageInput`s)."""
    if content is None:
        return "", None
    if isinstance(content, str):
        return content, None
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of content blocks", where)
    parts: list[Any] = []
    for i, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif kind == "image":
            parts.append(image_inputs.anthropic_block(block, f"{where}[{i}]"))
        elif kind in _UNSUPPORTED:
            raise bad_request(f"{where}[{i}]: {kind} blocks are not supported: the served model reads text and "
                              "images", where)
        else:
            raise bad_request(f"{where}[{i}] must be a text or image block", where)
    return _joined(parts)


def _joined(parts: list[Any]) -> tuple[str, list[Any] | None]:
    """Text blocks are joined by a blank line (how a text-only turn has always rendered); with
    images, the parts keep that separator between consecutive texts."""
    text = "\n\n".join(p for p in parts if isinstance(p, str))
    if all(isinstance(p, str) for p in parts):
        return text, None
    out: list[Any] = []
    for p in parts:
        if isinstance(p, str) and out and isinstance(out[-1], str):
            out[-1] += "\n\n" + p
        else:
            out.append(p)
    return text, out


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of content blocks", where)
    for i, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise bad_request(f"{where}[{i}] must be a content block with a 'type'", where)
    return content


def _user(blocks: list[dict[str, Any]], where: str) -> list[Message]:
    out: list[Message] = []
    parts: list[Any] = []
    for i, b in enumerate(blocks):
        kind = b["type"]
        if kind == "text":
            parts.append(str(b.get("text", "")))
        elif kind == "image":
            parts.append(image_inputs.anthropic_block(b, f"{where}[{i}]"))
        elif kind == "tool_result":
            content, tool_parts = _parts(b.get("content"), f"{where}[{i}].content")
            out.append(Message("tool", content, tool_call_id=str(b.get("tool_use_id", "")), parts=tool_parts))
        elif kind in _UNSUPPORTED:
            raise bad_request(f"{where}[{i}]: {kind} blocks are not supported: the served model reads text and "
                              "images", where)
        elif kind not in _SKIPPED:
            raise bad_request(f"{where}[{i}]: unsupported content block type {kind!r}", where)
    if parts:
        text, with_images = _joined(parts)
        out.append(Message("user", text, parts=with_images))
    return out


def _assistant(blocks: list[dict[str, Any]], where: str) -> Message:
    msg = Message("assistant")
    texts, thinking = [], []
    for i, b in enumerate(blocks):
        kind = b["type"]
        if kind == "text":
            texts.append(str(b.get("text", "")))
        elif kind == "thinking":
            thinking.append(str(b.get("thinking", "")))
        elif kind == "tool_use":
            if not isinstance(b.get("name"), str):
                raise bad_request(f"{where}[{i}].name is required", where)
            args = parse_arguments(b.get("input", {}), f"{where}[{i}].input")
            msg.tool_calls.append(ToolCall(name=b["name"], arguments=args, id=str(b.get("id", ""))))
        elif kind not in _SKIPPED:
            raise bad_request(f"{where}[{i}]: unsupported content block type {kind!r} in an assistant turn", where)
    msg.content = "".join(texts)
    msg.reasoning = "".join(thinking)
    return msg


def parse_tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise bad_request("'tools' must be a list", "tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise bad_request(f"tools[{i}] must be an object with a 'name'", "tools")
        if "input_schema" not in tool:  # server tools (web_search, bash_20250124, ...) run at Anthropic
            raise bad_request(f"tools[{i}] ({tool['name']}): only client tools with an input_schema are supported",
                              "tools")
        schema = tool["input_schema"] if isinstance(tool["input_schema"], dict) else {}
        out.append({"type": "function", "function": {"name": tool["name"],
                                                     "description": str(tool.get("description") or ""),
                                                     "parameters": schema}})
    return out


def _tool_choice(value: Any) -> Any:
    if value is None:
        return "auto"
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "auto":
        return "auto"
    if kind == "none":
        return "none"
    if kind == "any":
        return "required"
    if kind == "tool":
        return {"name": value.get("name")}
    raise bad_request("'tool_choice' must be {'type': 'auto' | 'any' | 'tool' | 'none'}", "tool_choice")


def parse_request(body: dict[str, Any], *, count_only: bool = False) -> CallRequest:
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise bad_request("messages: field required (a non-empty list)", "messages")
    max_tokens = as_int(body, "max_tokens", low=1)
    if max_tokens is None and not count_only:
        raise bad_request("max_tokens: field required", "max_tokens")
    messages: list[Message] = []
    if body.get("system") is not None:
        messages.append(Message("system", _text(body["system"], "system")))
    for i, m in enumerate(raw_messages):
        where = f"messages.{i}.content"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            raise bad_request(f"messages.{i}.role must be 'user', 'assistant' or 'system'", f"messages.{i}.role")
        if m["role"] == "system":  # Claude Code's mid-conversation system turns (a beta of the API)
            messages.append(Message("system", _text(m.get("content"), where)))
            continue
        blocks = _blocks(m.get("content", ""), where)
        messages += _user(blocks, where) if m["role"] == "user" else [_assistant(blocks, where)]
    return CallRequest(
        api=API_ANTHROPIC, model=str(body.get("model") or ""), messages=messages,
        tools=parse_tools(body.get("tools")), tool_choice=_tool_choice(body.get("tool_choice")),
        max_tokens=max_tokens, temperature=as_float(body, "temperature", low=0, high=1),
        top_p=as_float(body, "top_p", low=0, high=1), top_k=as_int(body, "top_k", low=1),
        stop=as_stop(body.get("stop_sequences"), "stop_sequences"),
        stream=bool(body.get("stream")),
    )


def signature(thinking: str) -> str:
    """A thinking block's `signature`: required by the API's shape; Anthropic's is a cryptographic
    seal, this one only a digest (the policy's thinking is not secret from the harness)."""
    return "forge-" + hashlib.sha256(thinking.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _content(comp: Completion) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if comp.reasoning:
        blocks.append({"type": "thinking", "thinking": comp.reasoning, "signature": signature(comp.reasoning)})
    if comp.text or not comp.tool_calls:
        blocks.append({"type": "text", "text": comp.text})
    blocks += [{"type": "tool_use", "id": tc.id, "name": tc.name, "input": tc.arguments} for tc in comp.tool_calls]
    return blocks


def _stop_reason(comp: Completion) -> str:
    return "stop_sequence" if comp.stop_sequence else _STOP[comp.finish_reason]


def _usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0}


def response_json(req: CallRequest, comp: Completion, *, call_id: str, model: str,
                  token_logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"id": call_id, "type": "message", "role": "assistant", "model": model, "content": _content(comp),
            "stop_reason": _stop_reason(comp), "stop_sequence": comp.stop_sequence,
            "usage": _usage(comp.prompt_tokens, comp.completion_tokens)}


class Stream:
    """message_start, then per block content_block_start / _delta / _stop, message_delta, message_stop."""

    def __init__(self, req: CallRequest, *, call_id: str, model: str, prompt_tokens: int = 0, **_: Any) -> None:
        self.req = req
        self.prompt_tokens = prompt_tokens
        self.call_id = call_id
        self.model = model
        self.index = -1
        self.text_open = False
        self.thinking: str | None = None  # the open thinking block's text so far
        self.answered = False  # a text or tool_use block was opened

    @staticmethod
    def _ev(data: dict[str, Any]) -> str:
        return sse(data, event=data["type"])

    def start(self) -> list[str]:
        message = {"id": self.call_id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                   "stop_reason": None, "stop_sequence": None, "usage": _usage(self.prompt_tokens, 1)}
        return [self._ev({"type": "message_start", "message": message}), self._ev({"type": "ping"})]

    def _close_text(self) -> list[str]:
        out = []
        if self.thinking is not None:  # the signature comes last, as the API sends it
            out.append(self._ev({"type": "content_block_delta", "index": self.index,
                                 "delta": {"type": "signature_delta", "signature": signature(self.thinking)}}))
            self.thinking = None
            out.append(self._ev({"type": "content_block_stop", "index": self.index}))
        if self.text_open:
            self.text_open = False
            out.append(self._ev({"type": "content_block_stop", "index": self.index}))
        return out

    def _open(self, block: dict[str, Any]) -> list[str]:
        out = self._close_text()
        self.index += 1
        return out + [self._ev({"type": "content_block_start", "index": self.index, "content_block": block})]

    def event(self, ev: StreamEvent) -> list[str]:
        out: list[str] = []
        if isinstance(ev, ReasoningDelta):
            if self.thinking is None:
                out += self._open({"type": "thinking", "thinking": "", "signature": ""})
                self.thinking = ""
            self.thinking += ev.text
            out.append(self._ev({"type": "content_block_delta", "index": self.index,
                                 "delta": {"type": "thinking_delta", "thinking": ev.text}}))
            return out
        if isinstance(ev, TextDelta):
            if not self.text_open:
                out += self._open({"type": "text", "text": ""})
                self.text_open = self.answered = True
            out.append(self._ev({"type": "content_block_delta", "index": self.index,
                                 "delta": {"type": "text_delta", "text": ev.text}}))
            return out
        if isinstance(ev, ToolCallStart):
            self.answered = True
            return self._open({"type": "tool_use", "id": ev.id, "name": ev.name, "input": {}})
        if isinstance(ev, ToolCallDelta):
            return [self._ev({"type": "content_block_delta", "index": self.index,
                              "delta": {"type": "input_json_delta", "partial_json": ev.arguments}})]
        # The call is complete (or malformed: closed with what was streamed; its text follows).
        return [self._ev({"type": "content_block_stop", "index": self.index})]

    def finish(self, comp: Completion, token_logprobs: list[dict[str, Any]] | None = None) -> list[str]:
        out = []
        if not self.answered:  # an answer without text or calls still has one (empty) text block, like the API
            out += self.event(TextDelta(""))
        out += self._close_text()
        out.append(self._ev({"type": "message_delta",
                             "delta": {"stop_reason": _stop_reason(comp), "stop_sequence": comp.stop_sequence},
                             "usage": {"output_tokens": comp.completion_tokens}}))
        out.append(self._ev({"type": "message_stop"}))
        return out

    def error(self, err: APIError) -> list[str]:
        return [sse(error_json(err), event="error")]
