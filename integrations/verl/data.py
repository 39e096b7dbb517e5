"""`forge export --format verl-sft|verl-rl`: datasets that veRL's own trainers read.

    verl-sft   one row per trajectory segment of every rollout that passed (or reached --min-reward):
               `messages` (the chat the harness sent on the segment's last call, plus the model's answer
               to it) and `tools` (the tools that call offered), for veRL's MultiTurnSFTDataset
               (`data.multiturn.messages_key=messages`, `tools_key=tools`).
    verl-rl    one row per task: `prompt` is the chat the harness really sent on its first call (system
               prompt, instruction, as the proxy parsed it for the chat template), `data_source` names
               the reward module this repo ships (integrations/verl/reward.py), `reward_model.ground_truth`
               the task's expected answer, `extra_info.task` the whole task record: for veRL's RLHFDataset
               and its custom reward function interface.

The messages are the proxy's own parse of each API (OpenAI Chat, Responses, Anthropic Messages) into
chat-template messages: Claude Code and Codex calls come out in the same shape as mini's. Every row has
the same columns and types (parquet: one struct schema; absent fields are null), tool-call arguments are
JSON strings (OpenAI's wire format, the one veRL's own multi-turn SFT data uses).

Parquet cannot hold arbitrary JSON faithfully: one struct schema for all tools pads each tool's schema
with the others' fields as nulls, and string arguments render quoted under `tojson` templates (Qwen2.5).
So verl-sft rows also carry `messages_json` and `tools_json`, exactly what the proxy gave the chat
template, and integrations/verl/sft.py's ForgeSFTDataset (veRL's MultiTurnSFTDataset, reading those two
columns; `data.custom_cls`) trains on exactly the recorded conversation.

Images (a GUI agent's screenshots) follow veRL's multimodal RLHFDataset: in `prompt` / `messages` an
image is an `<image>` marker in the text, and the row's `images` column holds the images in marker
order as `{"bytes": ...}` (the bytes the model saw, from the run's image store). The column is
only written when some row has an image.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from openforge.errors import TrainerError
from openforge.store import Call, Store
from openforge.trainer.data import is_usable

DATA_SOURCE = "openforge.integrations.verl.reward"  # the module whose compute_score grades these rows


def _request_with_images(call: Call, home: Path | None = None
                         ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[bytes]]:
    from openforge.image_store import ImageStore
    from openforge.paths import forge_home
    from openforge.proxy.api_adapters import ADAPTERS
    from openforge.proxy.calls import APIError
    from openforge.proxy.image_inputs import resolving_from

    adapter = ADAPTERS.get(call.api)
    if adapter is None or not isinstance(call.request_json, dict):
        raise TrainerError(f"call {call.id} of rollout {call.rollout_id} has no request in a known API ({call.api!r})")
    try:
        # A recorded body holds its images as references to the run's files (proxy/image_inputs.py).
        with resolving_from(ImageStore.for_run(home or forge_home(), call.run_id).get):
            req = adapter.parse_request(call.request_json)
    except APIError as exc:
        raise TrainerError(f"call {call.id} of rollout {call.rollout_id}: its request does not parse: {exc}") from None
    return [m.template_dict() for m in req.messages], req.tools, [im.data for m in req.messages for im in m.images]


def _home(store: Store) -> Path | None:
    """The data dir a store file lives in (`home/forge.db`); None for a database URL (FORGE_HOME)."""
    return store.path.parent if isinstance(store.path, Path) else None


def _with_image_markers(m: dict[str, Any]) -> dict[str, Any]:
    """A message whose content is text and image parts -> text with veRL's `<image>` markers."""
    if not isinstance(m.get("content"), list):
        return m
    text = "".join("<image>" if p.get("type") == "image" else str(p.get("text", "")) for p in m["content"])
    return {**m, "content": text}


def _images_column(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keep `images` only when some row has one (text-only exports keep their columns)."""
    if not any(r["images"] for r in rows):
        for r in rows:
            del r["images"]
    return rows


def _answer_text(call: Call) -> str:
    """The text part of what the model answered on this call (its tool calls apart), as the harness got it."""
    body = call.response_json if isinstance(call.response_json, dict) else {}
    if "choices" in body:  # Chat
        return str(((body.get("choices") or [{}])[0].get("message") or {}).get("content") or "")
    if body.get("type") == "message":  # Anthropic
        return "".join(b.get("text", "") for b in body.get("content") or [] if b.get("type") == "text")
    if "output" in body:  # Responses
        return "".join(part.get("text", "") for item in body["output"] if item.get("type") == "message"
                       for part in item.get("content") or [] if isinstance(part, dict))
    return ""


def _tool_call(tc: dict[str, Any]) -> dict[str, Any]:
    args = tc.get("arguments")
    fn = tc.get("function") if isinstance(tc.get("function"), dict) else {}
    name = tc.get("name") or fn.get("name") or ""
    if args is None:
        args = fn.get("arguments", {})
    return {"id": str(tc.get("id") or ""), "type": "function",
            "function": {"name": str(name), "arguments": args if isinstance(args, str) else json.dumps(args)}}


def regular_message(m: dict[str, Any]) -> dict[str, Any]:
    """One shape for every message: role, content (a string), tool_calls (a list), tool_call_id, name,
    reasoning_content (None where absent)."""
    return {"role": m["role"], "content": m.get("content") or "",
            "tool_calls": [_tool_call(tc) for tc in m.get("tool_calls") or []],
            "tool_call_id": m.get("tool_call_id"), "name": m.get("name"),
            "reasoning_content": m.get("reasoning_content")}


def _answer_message(call: Call) -> dict[str, Any]:
    """The model's answer on this call as Message.template_dict writes an assistant turn (arguments objects)."""
    out: dict[str, Any] = {"role": "assistant", "content": _answer_text(call)}
    if call.tool_calls_json:
        out["tool_calls"] = [
            {"id": str(tc.get("id") or ""), "type": "function",
             "function": {"name": str(tc.get("name") or ""), "arguments": tc.get("arguments") or {}}}
            for tc in call.tool_calls_json]
    return out


def sft_rows(store: Store, run_id: str, *, min_reward: float | None = None) -> list[dict[str, Any]]:
    """One row per trajectory segment of the rollouts that passed (reward >= the task's pass_threshold,
    or >= min_reward when given): the segment's last call's chat plus the model's answer to it."""
    run = store.get_run(run_id)
    thresholds = {t.task_id: float((t.spec_json or {}).get("pass_threshold", 1.0)) for t in store.list_tasks(run.id)}

    def passed(r: Any) -> bool:
        return float(r.reward) >= (min_reward if min_reward is not None else thresholds.get(r.task_id, 1.0))

    rollouts = {r.id: r for r in store.list_rollouts(run.id) if is_usable(r) and passed(r)}
    calls = {c.id: c for c in store.list_calls(run_id=run.id) if c.rollout_id in rollouts and c.status == "ok"}
    rows = []
    for traj in store.list_trajectories(run_id=run.id):
        r = rollouts.get(traj.rollout_id)
        seg = [calls[i] for i in traj.call_ids or [] if i in calls]
        if r is None or not seg:
            continue
        last = max(seg, key=lambda c: c.seq)
        messages, tools, images = _request_with_images(last, _home(store))
        messages.append(_answer_message(last))
        rows.append({
            "messages": [regular_message(_with_image_markers(m)) for m in messages], "tools": parquet_safe(tools),
            "images": [{"bytes": b} for b in images],
            # exactly what the proxy gave the chat template (arguments as objects), for ForgeSFTDataset
            "messages_json": json.dumps(messages), "tools_json": json.dumps(tools),
            "run_id": run.id, "rollout_id": r.id, "task_id": r.task_id, "step": r.step, "segment": traj.segment,
            "harness": r.harness, "reward": float(r.reward),  # type: ignore[arg-type]
        })
    return _images_column(rows)


def parquet_safe(value: Any) -> Any:
    """`value` without empty objects (`"additionalProperties": {}` and the like: parquet has no struct
    without fields; JSON Schema reads a missing one the same)."""
    if isinstance(value, dict):
        return {k: parquet_safe(v) for k, v in value.items() if not (isinstance(v, dict) and not v)}
    if isinstance(value, list):
        return [parquet_safe(v) for v in value]
    return value


def ground_truth(task: dict[str, Any]) -> str:
    """The task's expected answer as JSON (`{"number": 5.0}`), or "" when it expects none."""
    expect = task.get("expect_answer")
    return json.dumps({k: v for k, v in expect.items() if v is not None}) if isinstance(expect, dict) else ""


def rl_rows(store: Store, run_id: str) -> list[dict[str, Any]]:
    """One row per task of the run with a recorded call: the first call's chat as `prompt`."""
    run = store.get_run(run_id)
    tasks = {t.task_id: (t.spec_json or {}) for t in store.list_tasks(run.id)}
    rollouts = {r.id: r for r in store.list_rollouts(run.id)}
    first: dict[str, Call] = {}  # task -> the first ok call of its first rollout
    for c in sorted((c for c in store.list_calls(run_id=run.id) if c.status == "ok" and c.rollout_id in rollouts),
                    key=lambda c: (rollouts[c.rollout_id].step, rollouts[c.rollout_id].sample_index, c.rollout_id,
                                   c.seq)):
        first.setdefault(rollouts[c.rollout_id].task_id, c)
    rows = []
    for index, task_id in enumerate(sorted(first)):
        call, task = first[task_id], tasks.get(task_id, {})
        messages, tools, images = _request_with_images(call, _home(store))
        rows.append({
            "data_source": DATA_SOURCE, "prompt": [regular_message(_with_image_markers(m)) for m in messages],
            "images": [{"bytes": b} for b in images], "ability": "agent",
            "reward_model": {"style": "rule", "ground_truth": ground_truth(task)},
            "extra_info": {"index": index, "run_id": run.id, "task_id": task_id, "harness": rollouts[call.rollout_id].harness,
                           "task": json.dumps(task), "tools": json.dumps(tools)},
        })
    return _images_column(rows)


def _jsonl_images(row: dict[str, Any]) -> dict[str, Any]:
    """JSON has no bytes: an image is written as a data URL (`{"image": "data:image/png;base64,..."}`),
    which veRL's image loader (qwen_vl_utils.fetch_image) reads too."""
    if not row.get("images"):
        return row
    from openforge.image_store import image_format

    return {**row, "images": [{"image": f"data:image/{image_format(im['bytes'])};base64,"
                                        f"{base64.b64encode(im['bytes']).decode('ascii')}"} for im in row["images"]]}


def write_rows(rows: list[dict[str, Any]], out: str | Path) -> int:
    """Parquet for a .parquet name (one schema for all rows), else JSON lines."""
    from openforge.trainer.export import output_file

    path = output_file(out)
    try:
        if path.suffix == ".parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            try:
                pq.write_table(pa.Table.from_pylist(rows), str(path))
            except pa.lib.ArrowException as exc:
                raise TrainerError(f"these rows do not fit one parquet schema ({exc}); write .jsonl instead") from None
        else:
            with path.open("w", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(_jsonl_images(row)) + "\n")
    except OSError as exc:
        raise TrainerError(f"cannot write {path}: {exc}") from None
    return len(rows)
