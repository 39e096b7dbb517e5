"""Why a call's prompt broke the rollout's prefix: the new request's messages against the previous call's.

A harness that replays its history verbatim lets the proxy splice the sampled ids in (proxy/tokens.py)
and the trajectory stays one segment. When it does not, the call starts a new segment; this module
says *what* the harness did, by comparing the request's messages with the previous call's messages
plus the answer it got, so `forge show` and `forge analyze` can count the reasons:

    classify_break(previous, prev_tools, messages, tools)   # a BREAK_* label + why, or None

The labels are fixed strings (counted as they are); the first difference found decides.
"""

from __future__ import annotations

import re
from typing import Any

from openforge.proxy.calls import Message

SYSTEM_CHANGED = "system prompt changed: the request's system prompt differs from the previous call's"
TOOLS_CHANGED = "tools changed: the request declares other tools than the previous call"
THINKING_DROPPED = "thinking dropped: an earlier answer is replayed without its reasoning"
TOOL_RESULT_TRUNCATED = "tool result truncated: a tool result is replayed shorter than it was sent"
TOOL_RESULT_CHANGED = "tool result changed: a tool result is replayed with other content"
COMPACTED = "compaction: the history is replayed shorter (earlier turns summarised or dropped)"
SUMMARY_ASKED = "compaction: the history is sent on with a request for its summary and the tools withdrawn (Codex)"
RETRIED = "retried: the last user turn is resent with more text and without the answer (Claude Code after an empty answer)"
NEW_CONVERSATION = "new conversation: the first user turn differs (a sub-agent, or a side request)"
SUB_AGENT = "sub-agent: a new conversation opened by a prompt an earlier answer gave a tool (Claude Code's Agent)"
REWRITTEN = "history rewritten: an earlier turn is replayed with other content"

_THINK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)
# How a real harness opens the conversation it goes on with after compacting (Claude Code 2.1: its first
# user turn is replaced by this and the summary); Codex's is told by its shape (a later user turn).
CONTINUED = ("This session is being continued from a previous conversation",)


def _strip_thinking(text: str) -> str:
    return _THINK.sub("", text).strip()


def _same(a: Message, b: Message) -> bool:
    return a.template_dict() == b.template_dict()


def _differ_at(old: Message, new: Message) -> str:
    """The label for the first pair of messages that differ at one position of the history."""
    if old.role == new.role == "assistant" and old.content != new.content \
            and _strip_thinking(old.content) == _strip_thinking(new.content) and _THINK.search(old.content):
        return THINKING_DROPPED
    if old.role == new.role == "assistant" and old.reasoning and not new.reasoning \
            and old.content == new.content and _same(Message("assistant", old.content, old.tool_calls),
                                                     Message("assistant", new.content, new.tool_calls)):
        return THINKING_DROPPED  # the reasoning parser split it off; the harness did not send it back
    if old.role == new.role == "tool" and old.tool_call_id == new.tool_call_id:
        if len(new.content) < len(old.content):
            return TOOL_RESULT_TRUNCATED
        return TOOL_RESULT_CHANGED
    return REWRITTEN


def classify_break(previous: list[Message] | None, prev_tools: list[dict[str, Any]] | None,
                   messages: list[Message], tools: list[dict[str, Any]]) -> str | None:
    """Why `messages` does not extend `previous` (the last call's messages + its answer); None when
    it does, message for message (then the break is the chat template's, not the harness's)."""
    if previous is None:
        return None
    old = [m for m in previous if m.role != "system"]
    new = [m for m in messages if m.role != "system"]
    if _retried(old, new):
        return RETRIED
    if old and new and not _same(old[0], new[0]):
        return COMPACTED if any(mark in new[0].content for mark in CONTINUED) else NEW_CONVERSATION
    if [m.content for m in previous if m.role == "system"] != [m.content for m in messages if m.role == "system"]:
        return SYSTEM_CHANGED
    extended = len(new) > len(old) and all(_same(a, b) for a, b in zip(old, new))
    if extended and prev_tools and not tools and new[-1].role == "user":
        return SUMMARY_ASKED  # Codex's compaction: the whole history, a summary prompt, no tools
    if prev_tools is not None and prev_tools != tools:
        return TOOLS_CHANGED
    for a, b in zip(old, new):
        if _same(a, b):
            continue
        if len(new) < len(old) and (a.role != b.role or b.role == "user"):
            return COMPACTED  # turns replaced by fewer: a summary in a user turn (Codex's second replaces its first)
        if a.role == b.role:
            return _differ_at(a, b)
        return REWRITTEN
    if len(new) < len(old):
        return COMPACTED
    return None


def _retried(old: list[Message], new: list[Message]) -> bool:
    """`new` is `old` without its answer, the last user turn resent with text appended (a compaction that
    replaces several turns by a longer summary is not this)."""
    k = len(new) - 1
    if k < 0 or len(old) != k + 2 or new[k].role != "user" or old[k].role != "user":
        return False
    grown = new[k].content != old[k].content and new[k].content.startswith(old[k].content)
    return grown and all(_same(a, b) for a, b in zip(old[:k], new[:k]))


def _shared(previous: list[Message], messages: list[Message]) -> int:
    n = 0
    for a, b in zip(previous, messages):
        if not _same(a, b):
            break
        n += 1
    return n


def explain_break(recent: list[tuple[list[Message], list[dict[str, Any]]]], messages: list[Message],
                  tools: list[dict[str, Any]]) -> str | None:
    """`classify_break` against the recent call whose history this request shares the most of: a
    harness interleaves side requests (titles, sub-agents) with its main conversation."""
    if not recent:
        return None
    # Ties go to a call with the same tools: after Codex's tool-less summary request, the main conversation.
    previous, prev_tools = max(reversed(recent), key=lambda c: (_shared(c[0], messages), c[1] == tools))
    why = classify_break(previous, prev_tools, messages, tools)
    first = next((m.content for m in messages if m.role == "user"), "")
    return SUB_AGENT if why == NEW_CONVERSATION and _delegated(recent, first) else why


def _delegated(recent: list[tuple[list[Message], list[dict[str, Any]]]], first_user: str) -> bool:
    """An earlier answer called a tool with a text argument that this conversation's first user turn
    holds: the harness started a sub-agent on it (Claude Code's Agent `prompt`, Codex's spawn_agent)."""
    return any(isinstance(value, str) and len(value) >= 8 and value in first_user
               for previous, _ in recent for m in previous for call in m.tool_calls or []
               if isinstance(call.arguments, dict) for value in call.arguments.values())
