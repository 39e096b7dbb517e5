"""OpenAI Responses (`POST /v1/responses`, what Codex CLI speaks) <-> the internal call shape.

Shapes follow the official `openai` SDK types (`Response`, `ResponseOutputMessage`,
`ResponseFunctionToolCall`, `ResponseStreamEvent` members). Input items map like this:

    instructions                        -> a system message
    message (system/developer/user/assistant, text parts; user: input_image parts too, as data URLs)
                                        -> a message of that role
    function_call                       -> a tool call on the preceding assistant turn (or a new one)
    function_call_output                -> a tool message (its output's input_image parts included)
    reasoning                           -> the thinking of the assistant turn it precedes (its
                                           reasoning_text content, else the proxy's own marked
                                           encrypted_content, else its summary)

Thinking the reasoning parser split off is answered as a `reasoning` output item before the message
(streamed as `response.reasoning_text.delta` events, which Codex shows as raw reasoning).

The proxy keeps no conversation state: `previous_response_id` is refused; send the full `input`
(Codex does, with `store: false`).
"""

from __future__ import annotations

import time
from typing import Any

from openforge.proxy import openai_chat
from openforge.proxy.calls import (API_RESPONSES, APIError, CallRequest, Completion, Message, ReasoningDelta, StreamEvent,
                         TextDelta, ToolCall, ToolCallDelta, ToolCallEvent, ToolCallStart, as_float, as_int,
                         bad_request, new_call_id, parse_arguments, sse)

API = API_RESPONSES
RESPONSE_ID_PREFIX = "resp"
TOOL_ID_PREFIX = "call"
error_json = openai_chat.error_json
error_status = openai_chat.error_status
SEALED = "forge-thinking:"  # our `encrypted_content`: the thinking in clear, marked as the proxy's own
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def _input_items(items: Any) -> list[Message]:
    if isinstance(items, str):
        return [Message("user", items)]
    if not isinstance(items, list):
        raise bad_request("'input' must be a string or a list of items", "input")
    out: list[Message] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"{where} must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = _ROLES.get(item.get("role"))  # type: ignore[arg-type]
            if role is None:
                raise bad_request(f"{where}.role must be one of {', '.join(_ROLES)}", f"{where}.role")
            if role == "user":
                text, parts = openai_chat.parts_of(item.get("content"), f"{where}.content")
            else:
                text, parts = openai_chat.text_of(item.get("content"), f"{where}.content"), None
            if role == "assistant" and _thinking_only(out):  # the answer after its reasoning item
                out[-1].content = text
            else:
                out.append(Message(role, text, parts=parts))  # type: ignore[arg-type]
        elif kind == "function_call":
            if not isinstance(item.get("name"), str):
                raise bad_request(f"{where}.name is required", where)
            call = ToolCall(name=item["name"], arguments=parse_arguments(item.get("arguments", "{}"),
                                                                         f"{where}.arguments"),
                            id=str(item.get("call_id") or new_call_id()))
            if not out or out[-1].role != "assistant":
                out.append(Message("assistant"))
            out[-1].tool_calls.append(call)
        elif kind == "function_call_output":
            # The output is a string or a list of input_text / input_image parts (a screenshot).
            text, parts = openai_chat.parts_of(item.get("output"), f"{where}.output")
            out.append(Message("tool", text, tool_call_id=str(item.get("call_id", "")), parts=parts))
        elif kind == "reasoning":
            thinking = _reasoning_text(item)
            if thinking:
                out.append(Message("assistant", reasoning=thinking))
        else:
            raise bad_request(f"{where}: unsupported input item type {kind!r}", where)
    return out


def _thinking_only(out: list[Message]) -> bool:
    return bool(out) and out[-1].role == "assistant" and bool(out[-1].reasoning) and not out[-1].content \
        and not out[-1].tool_calls


def _reasoning_text(item: dict[str, Any]) -> str:
    """A replayed reasoning item's thinking: its reasoning_text parts, else its encrypted_content
    (where this proxy puts the thinking too, for clients that replay only that), else its summary."""
    for key, kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key)
        if isinstance(parts, list):
            text = "".join(p["text"] for p in parts if isinstance(p, dict) and p.get("type") == kind
                           and isinstance(p.get("text"), str))
            if text:
                return text
        sealed = item.get("encrypted_content")
        if key == "content" and isinstance(sealed, str) and sealed.startswith(SEALED):  # ours, not another API's
            return sealed[len(SEALED):]
    return ""


def _function(tool: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(tool.get("name"), str):
        raise bad_request(f"{where}.name is required", "tools")
    params = tool.get("parameters") if isinstance(tool.get("parameters"), dict) else {}
    return {"type": "function", "function": {"name": tool["name"], "description": str(tool.get("description") or ""),
                                             "parameters": params}}


def parse_tools(tools: Any) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Function tools (also those grouped in a `namespace`) become template tools; hosted tools
    (web_search, file_search, ...) cannot run here and are left out, so the model is never offered
    a tool nobody executes. Returns the tools and each namespaced tool's namespace."""
    if tools is None:
        return [], {}
    if not isinstance(tools, list):
        raise bad_request("'tools' must be a list", "tools")
    out, namespaces = [], {}
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise bad_request(f"tools[{i}] must be an object", "tools")
        if tool.get("type") == "function":
            out.append(_function(tool, f"tools[{i}]"))
        elif tool.get("type") == "namespace" and isinstance(tool.get("tools"), list):
            for j, member in enumerate(tool["tools"]):
                if isinstance(member, dict) and member.get("type") == "function":
                    out.append(_function(member, f"tools[{i}].tools[{j}]"))
                    namespaces[member["name"]] = str(tool.get("name") or "")
    return out, namespaces


def _tool_choice(value: Any) -> Any:
    if value is None or value in ("auto", "none", "required"):
        return value or "auto"
    if isinstance(value, dict) and value.get("type") == "function":
        return {"name": value.get("name")}
    raise bad_request("'tool_choice' must be 'auto', 'none', 'required' or a function", "tool_choice")


def parse_request(body: dict[str, Any]) -> CallRequest:
    if body.get("previous_response_id"):
        raise bad_request("previous_response_id is not supported: this proxy keeps no conversation state; "
                          "send the whole conversation as 'input'", "previous_response_id")
    if "input" not in body:
        raise bad_request("'input' is required", "input")
    messages = _input_items(body["input"])
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.insert(0, Message("system", body["instructions"]))
    if not messages:
        raise bad_request("'input' is empty", "input")
    tools, namespaces = parse_tools(body.get("tools"))
    return CallRequest(
        api=API_RESPONSES, model=str(body.get("model") or ""), messages=messages, tools=tools,
        namespaces=namespaces, tool_choice=_tool_choice(body.get("tool_choice")),
        max_tokens=as_int(body, "max_output_tokens", low=1), temperature=as_float(body, "temperature", low=0, high=2),
        top_p=as_float(body, "top_p", low=0, high=1), top_k=as_int(body, "top_k", low=1),
        stream=bool(body.get("stream")),
    )


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [_text_part(text)] if status == "completed" else []}


def _reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    done = status == "completed"
    return {"id": item_id, "type": "reasoning", "summary": [], "status": status,
            "encrypted_content": SEALED + text if done else None,
            "content": [{"type": "reasoning_text", "text": text}] if done else []}


def _call_item(item_id: str, tc: ToolCall, status: str, namespaces: dict[str, str]) -> dict[str, Any]:
    item = {"id": item_id, "type": "function_call", "call_id": tc.id, "name": tc.name,
            "arguments": tc.arguments_json if status == "completed" else "", "status": status}
    if tc.name in namespaces:
        item["namespace"] = namespaces[tc.name]
    return item


def _response(req: CallRequest, call_id: str, model: str, created: float, output: list[dict[str, Any]],
              comp: Completion | None) -> dict[str, Any]:
    status = "in_progress" if comp is None else ("incomplete" if comp.finish_reason == "length" else "completed")
    usage = None if comp is None else {
        "input_tokens": comp.prompt_tokens, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": comp.completion_tokens, "output_tokens_details": {"reasoning_tokens": comp.reasoning_tokens},
        "total_tokens": comp.prompt_tokens + comp.completion_tokens}
    return {"id": call_id, "object": "response", "created_at": created, "status": status, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": None, "model": model, "output": output, "parallel_tool_calls": True,
            "temperature": req.temperature, "top_p": req.top_p, "tool_choice": req.tool_choice
            if isinstance(req.tool_choice, str) else {"type": "function", **req.tool_choice},
            "tools": [{"type": "function", **t["function"]} for t in req.tools], "usage": usage,
            "max_output_tokens": req.max_tokens, "text": {"format": {"type": "text"}}}


def response_json(req: CallRequest, comp: Completion, *, call_id: str, model: str,
                  token_logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    output = [_reasoning_item(new_call_id("rs"), comp.reasoning, "completed")] if comp.reasoning else []
    if comp.text or not comp.tool_calls:
        output.append(_message_item(new_call_id("msg"), comp.text, "completed"))
    output += [_call_item(new_call_id("fc"), tc, "completed", req.namespaces) for tc in comp.tool_calls]
    return _response(req, call_id, model, time.time(), output, comp)


class Stream:
    """response.created / in_progress, then per output item: output_item.added, its content or
    argument deltas and their .done events, output_item.done; then response.completed (or incomplete).
    Items: the reasoning (if any), the message text, then one function_call per tool call, its
    arguments streamed as the model writes them."""

    def __init__(self, req: CallRequest, *, call_id: str, model: str, **_: Any) -> None:
        self.req, self.call_id, self.model = req, call_id, model
        self.created = time.time()
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self.text_item: str | None = None
        self.text = ""
        self.think_item: str | None = None
        self.thinking = ""
        self.calls: dict[int, tuple[str, int, ToolCallStart]] = {}  # stream index -> item id, output index, start
        self.args: dict[int, str] = {}

    def _ev(self, data: dict[str, Any]) -> str:
        data["sequence_number"] = self.seq
        self.seq += 1
        return sse(data, event=data["type"])

    def start(self) -> list[str]:
        resp = _response(self.req, self.call_id, self.model, self.created, [], None)
        return [self._ev({"type": "response.created", "response": resp}),
                self._ev({"type": "response.in_progress", "response": resp})]

    def _open_text(self) -> list[str]:
        self.text_item, self.text = new_call_id("msg"), ""
        idx = len(self.output)
        return [self._ev({"type": "response.output_item.added", "output_index": idx,
                          "item": _message_item(self.text_item, "", "in_progress")}),
                self._ev({"type": "response.content_part.added", "item_id": self.text_item, "output_index": idx,
                          "content_index": 0, "part": _text_part("")})]

    def _close_text(self) -> list[str]:
        if self.text_item is None:
            return []
        idx, item_id = len(self.output), self.text_item
        item = _message_item(item_id, self.text, "completed")
        self.output.append(item)
        self.text_item = None
        return [self._ev({"type": "response.output_text.done", "item_id": item_id, "output_index": idx,
                          "content_index": 0, "text": self.text, "logprobs": []}),
                self._ev({"type": "response.content_part.done", "item_id": item_id, "output_index": idx,
                          "content_index": 0, "part": _text_part(self.text)}),
                self._ev({"type": "response.output_item.done", "output_index": idx, "item": item})]

    def _close_thinking(self) -> list[str]:
        if self.think_item is None:
            return []
        idx, item_id = len(self.output), self.think_item
        item = _reasoning_item(item_id, self.thinking, "completed")
        self.output.append(item)
        self.think_item = None
        return [self._ev({"type": "response.reasoning_text.done", "item_id": item_id, "output_index": idx,
                          "content_index": 0, "text": self.thinking}),
                self._ev({"type": "response.output_item.done", "output_index": idx, "item": item})]

    def event(self, ev: StreamEvent) -> list[str]:
        if isinstance(ev, ReasoningDelta):
            out = []
            if self.think_item is None:
                self.think_item, self.thinking = new_call_id("rs"), ""
                out.append(self._ev({"type": "response.output_item.added", "output_index": len(self.output),
                                     "item": _reasoning_item(self.think_item, "", "in_progress")}))
            self.thinking += ev.text
            out.append(self._ev({"type": "response.reasoning_text.delta", "item_id": self.think_item,
                                 "output_index": len(self.output), "content_index": 0, "delta": ev.text}))
            return out
        out = self._close_thinking()
        if isinstance(ev, TextDelta):
            out += self._open_text() if self.text_item is None else []
            self.text += ev.text
            out.append(self._ev({"type": "response.output_text.delta", "item_id": self.text_item,
                                 "output_index": len(self.output), "content_index": 0, "delta": ev.text,
                                 "logprobs": []}))
            return out
        out += self._close_text()
        if isinstance(ev, ToolCallStart):
            item_id, idx = new_call_id("fc"), len(self.output)
            self.calls[ev.index], self.args[ev.index] = (item_id, idx, ev), ""
            self.output.append({})  # its place, filled when the call is done
            pending = ToolCall(ev.name, {}, ev.id)
            return out + [self._ev({"type": "response.output_item.added", "output_index": idx,
                                    "item": _call_item(item_id, pending, "in_progress", self.req.namespaces)})]
        if isinstance(ev, ToolCallDelta):
            item_id, idx, _ = self.calls[ev.index]
            self.args[ev.index] += ev.arguments
            return out + [self._ev({"type": "response.function_call_arguments.delta", "item_id": item_id,
                                    "output_index": idx, "delta": ev.arguments})]
        assert isinstance(ev, ToolCallEvent)
        item_id, idx, start = self.calls[ev.index]
        tc = ev.call if not ev.malformed else ToolCall(start.name, {}, start.id, raw_arguments=self.args[ev.index])
        done = _call_item(item_id, tc, "completed", self.req.namespaces)
        self.output[idx] = done
        return out + [
            self._ev({"type": "response.function_call_arguments.done", "item_id": item_id, "output_index": idx,
                      "name": tc.name, "arguments": tc.arguments_json}),
            self._ev({"type": "response.output_item.done", "output_index": idx, "item": done}),
        ]

    def finish(self, comp: Completion, token_logprobs: list[dict[str, Any]] | None = None) -> list[str]:
        out = self._close_thinking()
        if not any(item.get("type") in ("message", "function_call") for item in self.output) \
                and self.text_item is None:
            out += self._open_text()
        out += self._close_text()
        resp = _response(self.req, self.call_id, self.model, self.created, self.output, comp)
        kind = "response.incomplete" if resp["status"] == "incomplete" else "response.completed"
        return out + [self._ev({"type": kind, "response": resp})]

    def error(self, err: APIError) -> list[str]:
        resp = _response(self.req, self.call_id, self.model, self.created, self.output, None)
        resp["status"] = "failed"
        resp["error"] = {"code": "server_error" if err.status >= 500 else "invalid_request", "message": err.message}
        return [self._ev({"type": "response.failed", "response": resp})]
