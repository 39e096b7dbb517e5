"""What the dashboard shows, read from the store in one go, and a recorded call rendered as turns.

Kept apart from the Textual code so that it can be tested (and reused by `forge show`-like tools)
without an app: `read_snapshot` is a handful of small queries, each bounded by a limit, so polling it
every second stays cheap however long the run is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, literal_column
from sqlalchemy.orm import load_only
from sqlmodel import select

from openforge.store import Call, Rollout, Run, Store, TrainStep, utcnow


@dataclass
class Snapshot:
    run: Run
    config: dict[str, Any]
    steps: list[TrainStep]
    rollouts: list[Rollout]  # in flight first, then the most recently created
    calls: list[Call]  # newest first
    counts: dict[str, int] = field(default_factory=dict)  # rollouts of the whole run by status
    n_calls: int = 0
    now: datetime = field(default_factory=utcnow)


# Only the columns on screen: a rollout's stdout/stderr (up to 64 KB each) and a call's request and
# response (the whole conversation) stay in the file; a call is read in full when it is opened.
_ROLLOUT_COLS = (Rollout.id, Rollout.run_id, Rollout.task_id, Rollout.step, Rollout.status, Rollout.reward,
                 Rollout.n_calls, Rollout.n_tokens, Rollout.created_at, Rollout.started_at, Rollout.ended_at)
# Newest by rowid, not created_at: SQLite reads a column stored after a large one (stdout) by walking
# its overflow pages, so sorting 2,000 rollouts by created_at costs ~80 ms where rowid (insertion
# order, which is creation order) costs ~0.05 ms.
_ROWID = literal_column("rollout.rowid")
_CALL_COLS = (Call.id, Call.run_id, Call.rollout_id, Call.api, Call.status, Call.prompt_tokens,
              Call.completion_tokens, Call.latency_ms, Call.finish_reason)


def read_snapshot(store: Store, run_id: str, *, max_rollouts: int = 40, max_calls: int = 30) -> Snapshot:
    run = store.get_run(run_id)
    with store.session() as s:
        counts = dict(s.exec(
            select(Rollout.status, func.count()).where(Rollout.run_id == run.id).group_by(Rollout.status)
        ).all())
        n_calls = s.exec(select(func.count()).select_from(Call).where(Call.run_id == run.id)).one()
        rollouts = select(Rollout).options(load_only(*_ROLLOUT_COLS)).where(Rollout.run_id == run.id)
        live = list(s.exec(
            rollouts.where(Rollout.status.in_(("pending", "running")))  # type: ignore[attr-defined]
            .order_by(_ROWID).limit(max_rollouts)
        ).all())
        recent = list(s.exec(rollouts.order_by(_ROWID.desc()).limit(max_rollouts)).all())
        calls = list(s.exec(
            select(Call).options(load_only(*_CALL_COLS)).where(Call.run_id == run.id)
            .order_by(Call.id.desc()).limit(max_calls)  # type: ignore[union-attr]
        ).all())
    seen = {r.id for r in live}
    return Snapshot(
        run=run, config=run.config_json or {}, steps=store.list_train_steps(run.id),
        rollouts=(live + [r for r in recent if r.id not in seen])[:max_rollouts], calls=calls,
        counts=counts, n_calls=int(n_calls),
    )


def run_log_path(store_path: str | Path, run_id: str) -> Path:
    """The run's log file: `forge up` writes it, the dashboard tails it (`<home>/runs/<id>/forge.log`)."""
    return Path(store_path).parent / "runs" / run_id / "forge.log"


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
