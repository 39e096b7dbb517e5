"""Rows written straight into the store for the analysis tests: a call, a chat call, a tool message."""

from __future__ import annotations

from typing import Any

from openforge.store import Call, Store


CHAT_TOOLS = [{"type": "function", "function": {"name": n, "parameters": {}}} for n in ("bash", "read_file", "write_file")]


def _chat_call(seq: int, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, *,
               text: str = "", status: str = "ok") -> Call:
    body = {"model": "m", "messages": messages, "tools": CHAT_TOOLS}
    calls = [{"id": f"c{seq}-{i}", "name": n, "arguments": a} for i, (n, a) in enumerate(tools or [])]
    response = {"choices": [{"message": {"role": "assistant", "content": text}}]}
    return Call(run_id="", rollout_id="", seq=seq, api="openai_chat", status=status, request_json=body,
                response_json=response, tool_calls_json=calls, completion_tokens=10 + seq)


def _tool_msg(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _add(store: Store, run_id: str, task_id: str, step: int, calls: list[Call], *, reward: float | None,
         status: str = "scored", harness: str = "mini") -> None:
    ro = store.create_rollout(run_id=run_id, task_id=task_id, step=step, harness=harness)
    store.update_rollout(ro.id, status=status, reward=reward)
    for c in calls:
        c.run_id, c.rollout_id, c.id = run_id, ro.id, None
        store.add_call(c)
