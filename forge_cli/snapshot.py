"""A recorded call rendered as conversation turns, for the dashboard's call view (any of the three APIs)."""

from __future__ import annotations

import json
from typing import Any

from openforge.store import Call


# ---------------------------------------------------------------------------------------------
# A call as conversation turns. The three APIs spell the same things differently:
#   chat:      messages[{role, content: str | [{type: text, text}], tool_calls}], response choices[0].message
#   anthropic: system, messages[{role, content: str | [text | tool_use | tool_result blocks]}], response content
#   responses: instructions, input: str | [{role, content} | function_call | function_call_output], response output


def _text(content: Any) -> str:
    """Flatten any of the APIs' content shapes into readable text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(t for t in (_text(part) for part in content) if t)
    if isinstance(content, dict):
        kind = content.get("type", "")
        if kind in ("tool_use", "function_call"):
            args = content.get("input", content.get("arguments", {}))
            return f"-> {content.get('name', '?')}({args if isinstance(args, str) else json.dumps(args)})"
        if kind in ("tool_result", "function_call_output"):
            return f"<- {_text(content.get('content', content.get('output')))}"
        if kind in ("image_url", "input_image", "image"):  # the bytes are in the run's images/ (call.images)
            return "[image]"
        if "text" in content:
            return str(content["text"])
        if "content" in content:
            return _text(content["content"])
        return json.dumps(content, ensure_ascii=False)
    return str(content)


def _turn(item: Any) -> tuple[str, str]:
    if not isinstance(item, dict):
        return "user", _text(item)
    role = item.get("role") or {"function_call": "assistant", "function_call_output": "tool"}.get(
        item.get("type", ""), item.get("type", "item"))
    text = _text(item.get("content")) if "content" in item and "role" in item else _text(item)
    for tc in item.get("tool_calls") or []:
        fn = tc.get("function", tc)
        text += f"\n-> {fn.get('name', '?')}({fn.get('arguments', '')})"
    return str(role), text.strip()


def request_turns(api: str, request: dict[str, Any]) -> list[tuple[str, str]]:
    turns: list[tuple[str, str]] = []
    system = request.get("system") or request.get("instructions")
    if system:
        turns.append(("system", _text(system)))
    items = request.get("messages", request.get("input", []))
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    turns.extend(_turn(item) for item in items or [])
    if request.get("tools"):
        names = [t.get("name") or t.get("function", {}).get("name", "?") for t in request["tools"]]
        turns.insert(0, ("tools", ", ".join(str(n) for n in names)))
    return turns


def response_turns(api: str, response: dict[str, Any]) -> list[tuple[str, str]]:
    if "choices" in response:  # chat completions
        return [("assistant (sampled)", _turn(ch.get("message", {}))[1]) for ch in response["choices"][:1]]
    if "output" in response:  # responses
        return [("assistant (sampled)", "\n".join(_turn(i)[1] for i in response["output"]).strip())]
    if "content" in response:  # anthropic messages
        return [("assistant (sampled)", _text(response["content"]))]
    return [("response", json.dumps(response, ensure_ascii=False)[:4000])]


def conversation(call: Call) -> list[tuple[str, str]]:
    """The call as (role, text) turns: the prompt as the harness sent it, then what was sampled."""
    request, response = call.request_json or {}, call.response_json
    if isinstance(request, str):  # JSON text not yet stored (the column decodes what it holds)
        return [("raw", request), ("raw response", str(response or ""))]
    turns = request_turns(call.api, request) if isinstance(request, dict) else [("request", str(request))]
    if isinstance(response, dict):
        turns.extend(response_turns(call.api, response))
    elif call.status == "in_flight":
        turns.append(("assistant", "(sampling...)"))
    return turns
