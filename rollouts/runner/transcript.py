"""A rollout's recorded calls read back as what the agent did: its tool steps, their results, its answer.

Each recorded call holds the harness's raw request (the whole history so far, in that API's shape)
and the proxy's parse of the model's tool calls. Tool *uses* come from the calls themselves
(`tool_calls_json`, the proxy's API-neutral parse of the sampled tokens); tool *results* only exist in
later requests, where the harness sends them back, so they are matched to their use by the tool-call
id, in every API's own field:

    openai_chat          {"role": "tool", "tool_call_id": ID, "content": ...}
    openai_responses     {"type": "function_call_output", "call_id": ID, "output": ...}
    anthropic_messages   {"type": "tool_result", "tool_use_id": ID, "content": ..., "is_error": bool}

The tools a harness offered are read from the first call's `tools` (the names of OpenAI function
tools, Responses function tools, or Anthropic tools).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from openforge.store import Call

# A tool result counts as failed when the API says so (Anthropic's `is_error`) or its text shows a
# failure the way the harnesses we run report one. Each pattern is anchored to those harnesses' own
# wording (mini: "exit code N" / "error: ..."; Codex: "Process exited with code N"; Claude Code:
# is_error, "Exit code N"), so ordinary output that merely mentions an error is not a failure.
_FAILED = [
    re.compile(r"^\s*error\b", re.IGNORECASE),
    re.compile(r"\bexit(?:ed)? (?:with )?code:? *[1-9]\d*\b", re.IGNORECASE),
    re.compile(r"^Traceback \(most recent call last\):", re.MULTILINE),
    re.compile(r": command not found\b"),
]


@dataclass
class ToolStep:
    """One tool call the model made, and what the harness sent back for it (None: never sent back)."""

    call_seq: int  # the recorded call whose completion made this tool call
    id: str
    name: str
    arguments: dict[str, Any]
    result: str | None = None
    failed: bool | None = None  # None while no result came back


@dataclass
class Transcript:
    turns: int  # recorded calls that the engine answered (status ok)
    steps: list[ToolStep]
    tools_offered: list[str]
    final_text: str | None  # the text of the last answered call when it made no tool call
    completion_tokens: list[int] = field(default_factory=list)  # per answered call
    prompt_tokens: list[int] = field(default_factory=list)
    break_reasons: list[str] = field(default_factory=list)  # one per call whose prompt broke the prefix


def _text(content: Any) -> str:
    """A result's content: a string, or a list of text blocks/parts (any API)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text(part.get("text", part.get("content", ""))) if isinstance(part, dict) else str(part)
                         for part in content)
    return "" if content is None else json.dumps(content)


def tool_failed(text: str, *, is_error: bool | None = None) -> bool:
    """Whether a tool result reports a failure (see `_FAILED`). `is_error` from the API wins when True."""
    if is_error:
        return True
    return any(p.search(text) for p in _FAILED)


def tool_results(request: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """Tool-call id -> (result text, failed) for every tool result in one raw request body."""
    out: dict[str, tuple[str, bool]] = {}
    for m in request.get("messages") or []:  # Chat and Anthropic
        if not isinstance(m, dict):
            continue
        if m.get("role") == "tool" and m.get("tool_call_id"):
            text = _text(m.get("content"))
            out[str(m["tool_call_id"])] = (text, tool_failed(text))
        content = m.get("content")
        if isinstance(content, list):
            for block in content:
                if isinstance(block, dict) and block.get("type") == "tool_result" and block.get("tool_use_id"):
                    text = _text(block.get("content"))
                    out[str(block["tool_use_id"])] = (text, tool_failed(text, is_error=block.get("is_error")))
    items = request.get("input")
    for item in items if isinstance(items, list) else []:  # Responses
        if isinstance(item, dict) and item.get("type") == "function_call_output" and item.get("call_id"):
            text = _text(item.get("output"))
            out[str(item["call_id"])] = (text, tool_failed(text))
    return out


def tools_offered(request: dict[str, Any]) -> list[str]:
    names = []
    for tool in request.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        name = tool.get("name") or (tool.get("function") or {}).get("name")
        if name:
            names.append(str(name))
    return names


def _request(call: Call) -> dict[str, Any]:
    return call.request_json if isinstance(call.request_json, dict) else {}


def _tool_calls(call: Call) -> list[dict[str, Any]]:
    return call.tool_calls_json if isinstance(call.tool_calls_json, list) else []


def final_text(call: Call) -> str | None:
    """The text of one recorded call's completion (any API), None when its response is unreadable."""
    body = call.response_json
    if not isinstance(body, dict):
        return None
    if "choices" in body:  # Chat
        return _text(((body.get("choices") or [{}])[0].get("message") or {}).get("content"))
    if body.get("type") == "message":  # Anthropic
        return "".join(b.get("text", "") for b in body.get("content") or [] if b.get("type") == "text")
    if "output" in body:  # Responses
        return "".join(_text(item.get("content")) for item in body["output"] if item.get("type") == "message")
    return None


def transcript_of(calls: Iterable[Call]) -> Transcript:
    """The transcript of one rollout from its recorded calls (any order; sorted by `seq` here)."""
    ordered = sorted(calls, key=lambda c: c.seq)
    answered = [c for c in ordered if c.status == "ok"]
    steps: list[ToolStep] = []
    results: dict[str, tuple[str, bool]] = {}
    for call in ordered:
        results.update(tool_results(_request(call)))
    for call in answered:
        for tc in _tool_calls(call):
            args = tc.get("arguments")
            steps.append(ToolStep(call_seq=call.seq, id=str(tc.get("id", "")), name=str(tc.get("name", "")),
                                  arguments=args if isinstance(args, dict) else {}))
    for step in steps:
        if step.id in results:
            step.result, step.failed = results[step.id]
    final = None
    if answered and not _tool_calls(answered[-1]):
        final = final_text(answered[-1])
    return Transcript(
        turns=len(answered), steps=steps,
        tools_offered=tools_offered(_request(ordered[0])) if ordered else [],
        final_text=final,
        completion_tokens=[c.completion_tokens for c in answered],
        prompt_tokens=[c.prompt_tokens for c in answered],
        break_reasons=[r for c in ordered if (r := getattr(c, "break_reason", None))],
    )


def action_history(calls: Iterable[Call], *, max_line: int = 300) -> list[str]:
    """What the agent did, one line per action, in order: each answered call's tool calls as
    `name({json arguments})`, or, for a call without one (a text-action agent such as mini-gui's
    `click(3)`), its text on one line; each cut to `max_line` characters. A judge's action history."""
    out = []
    for call in sorted((c for c in calls if c.status == "ok"), key=lambda c: c.seq):
        tool_calls = _tool_calls(call)
        lines = [f"{tc.get('name', '')}({json.dumps(tc.get('arguments'), ensure_ascii=False)})" for tc in tool_calls] \
            if tool_calls else [" ".join((final_text(call) or "").split())]
        out += [line[:max_line] for line in lines if line]
    return out


def shell_command(step: ToolStep) -> str | None:
    """The shell command of a shell-like tool step (mini's bash, Claude Code's Bash, Codex's
    exec_command / shell), else None."""
    if step.name.lower() not in SHELL_TOOLS:
        return None
    for key in ("command", "cmd"):
        value = step.arguments.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, Sequence) and not isinstance(value, str):  # Codex's argv form
            return " ".join(str(v) for v in value)
    return None


SHELL_TOOLS = {"bash", "shell", "exec_command", "local_shell", "run_command", "terminal"}
