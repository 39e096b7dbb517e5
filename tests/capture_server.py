"""A loopback server that records what a real harness sends and answers just enough to keep it going.

It stands in for a model API while we learn (and keep checking) the exact wire protocol of Claude
Code and Codex: every request is logged (method, path, headers, JSON body) to a JSONL file, and the
answer is a minimally valid Anthropic Messages reply or OpenAI Responses SSE stream. The reply
policy makes a harness do one tool round-trip: while the conversation holds no tool result, the
answer is one call of the harness's shell tool running `CAPTURE_COMMAND`; after it, a text answer.

    python tests/capture_server.py --port 8765 --log /tmp/capture.jsonl --command 'echo hi > out.txt'

Only a discovery/test aid: the product's proxy is `proxy/`.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

ANSWER = "Done."


def _sse(event: str | None, data: dict[str, Any]) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n"


# --------------------------------------------------------------------------------------------
# Anthropic Messages


def _anthropic_has_tool_result(body: dict[str, Any]) -> bool:
    for msg in body.get("messages", []):
        content = msg.get("content")
        if isinstance(content, list) and any(b.get("type") == "tool_result" for b in content):
            return True
    return False


def _anthropic_blocks(body: dict[str, Any], command: str) -> list[dict[str, Any]]:
    tool_names = {t.get("name") for t in body.get("tools") or []}
    if not _anthropic_has_tool_result(body):
        if "Bash" in tool_names:  # Claude Code
            return [{"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:20]}", "name": "Bash",
                     "input": {"command": command, "description": "Run the scripted command"}}]
        if "exec" in tool_names:  # OpenClaw
            return [{"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:20]}", "name": "exec",
                     "input": {"command": command}}]
    return [{"type": "text", "text": ANSWER}]


# --------------------------------------------------------------------------------------------
# OpenAI Chat Completions


def chat_reply(body: dict[str, Any], command: str) -> dict[str, Any]:
    """The assistant message: a call of the shell tool until a tool result is in the history; the GUI
    harnesses get their own `done` action (browser-use: its AgentOutput JSON; mini-gui: the done tool)."""
    names = {(t.get("function") or {}).get("name") for t in body.get("tools") or []}
    if ((body.get("response_format") or {}).get("json_schema") or {}).get("name") == "agent_output":
        return {"role": "assistant", "content": json.dumps({"thinking": "", "evaluation_previous_goal": "", "memory": "",
            "next_goal": "", "action": [{"done": {"text": ANSWER, "success": True, "files_to_display": []}}]})}
    if {"click", "done"} <= names:
        return {"role": "assistant", "content": None, "tool_calls": [{"id": f"call_{uuid.uuid4().hex[:20]}",
                "type": "function", "function": {"name": "done", "arguments": json.dumps({"answer": ANSWER})}}]}
    done = any(m.get("role") == "tool" for m in body.get("messages", []))
    for name in ("exec", "bash", "shell"):
        if name in names and not done:
            call = {"id": f"call_{uuid.uuid4().hex[:20]}", "type": "function",
                    "function": {"name": name, "arguments": json.dumps({"command": command})}}
            return {"role": "assistant", "content": None, "tool_calls": [call]}
    return {"role": "assistant", "content": ANSWER}


def chat_stream(body: dict[str, Any], message: dict[str, Any]) -> list[str]:
    cid, created, model = f"chatcmpl-{uuid.uuid4().hex[:20]}", int(time.time()), body.get("model", "m")

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        return _sse(None, {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra})

    out = [chunk({"role": "assistant", "content": ""})]
    if message.get("tool_calls"):
        call = message["tool_calls"][0]
        out.append(chunk({"tool_calls": [{"index": 0, "id": call["id"], "type": "function",
                                          "function": {"name": call["function"]["name"], "arguments": ""}}]}))
        out.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": call["function"]["arguments"]}}]}))
        out.append(chunk({}, "tool_calls"))
    else:
        out.append(chunk({"content": message["content"]}))
        out.append(chunk({}, "stop"))
    if (body.get("stream_options") or {}).get("include_usage"):
        out.append(_sse(None, {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                               "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5,
                                                        "total_tokens": 15}}))
    return out + ["data: [DONE]\n\n"]


def anthropic_stream(body: dict[str, Any], blocks: list[dict[str, Any]]) -> list[str]:
    stop = "tool_use" if blocks[0]["type"] == "tool_use" else "end_turn"
    msg = {"id": f"msg_{uuid.uuid4().hex[:20]}", "type": "message", "role": "assistant",
           "model": body.get("model", "m"), "content": [], "stop_reason": None, "stop_sequence": None,
           "usage": {"input_tokens": 10, "output_tokens": 1}}
    out = [_sse("message_start", {"type": "message_start", "message": msg})]
    for i, block in enumerate(blocks):
        if block["type"] == "text":
            out.append(_sse("content_block_start", {"type": "content_block_start", "index": i,
                                                    "content_block": {"type": "text", "text": ""}}))
            out.append(_sse("content_block_delta", {"type": "content_block_delta", "index": i,
                                                    "delta": {"type": "text_delta", "text": block["text"]}}))
        else:
            start = dict(block, input={})
            out.append(_sse("content_block_start", {"type": "content_block_start", "index": i,
                                                    "content_block": start}))
            out.append(_sse("content_block_delta", {"type": "content_block_delta", "index": i, "delta": {
                "type": "input_json_delta", "partial_json": json.dumps(block["input"])}}))
        out.append(_sse("content_block_stop", {"type": "content_block_stop", "index": i}))
    out.append(_sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                      "usage": {"output_tokens": 5}}))
    out.append(_sse("message_stop", {"type": "message_stop"}))
    return out


# --------------------------------------------------------------------------------------------
# OpenAI Responses

SHELL_TOOLS = ("shell", "shell_command", "exec_command")


def _responses_call(body: dict[str, Any], command: str) -> dict[str, Any] | None:
    items = body.get("input") or []
    if any(isinstance(i, dict) and i.get("type", "").endswith("_call_output") for i in items):
        return None
    names = {t.get("name") for t in body.get("tools") or [] if t.get("type") == "function"}
    for name in SHELL_TOOLS:
        if name in names:
            args = {"shell": {"command": ["bash", "-lc", command]},
                    "shell_command": {"command": command},
                    "exec_command": {"cmd": command}}[name]
            return {"type": "function_call", "id": f"fc_{uuid.uuid4().hex[:20]}",
                    "call_id": f"call_{uuid.uuid4().hex[:20]}", "name": name,
                    "arguments": json.dumps(args), "status": "completed"}
    return None


def responses_stream(body: dict[str, Any], command: str) -> list[str]:
    rid = f"resp_{uuid.uuid4().hex[:20]}"
    base = {"id": rid, "object": "response", "created_at": int(time.time()), "model": body.get("model", "m"),
            "output": [], "status": "in_progress"}
    seq = iter(range(10_000))
    out = [_sse("response.created", {"type": "response.created", "sequence_number": next(seq), "response": base})]
    call = _responses_call(body, command)
    if call is not None:
        item = call
        out.append(_sse("response.output_item.added", {"type": "response.output_item.added", "sequence_number": next(seq),
                                                       "output_index": 0, "item": dict(call, arguments="", status="in_progress")}))
        out.append(_sse("response.function_call_arguments.delta", {
            "type": "response.function_call_arguments.delta", "sequence_number": next(seq),
            "item_id": call["id"], "output_index": 0, "delta": call["arguments"]}))
        out.append(_sse("response.function_call_arguments.done", {
            "type": "response.function_call_arguments.done", "sequence_number": next(seq),
            "item_id": call["id"], "output_index": 0, "arguments": call["arguments"]}))
    else:
        mid = f"msg_{uuid.uuid4().hex[:20]}"
        part = {"type": "output_text", "text": ANSWER, "annotations": []}
        item = {"type": "message", "id": mid, "role": "assistant", "status": "completed", "content": [part]}
        out.append(_sse("response.output_item.added", {"type": "response.output_item.added", "sequence_number": next(seq),
                                                       "output_index": 0, "item": dict(item, content=[], status="in_progress")}))
        out.append(_sse("response.content_part.added", {"type": "response.content_part.added", "sequence_number": next(seq),
                                                        "item_id": mid, "output_index": 0, "content_index": 0,
                                                        "part": dict(part, text="")}))
        out.append(_sse("response.output_text.delta", {"type": "response.output_text.delta", "sequence_number": next(seq),
                                                       "item_id": mid, "output_index": 0, "content_index": 0, "delta": ANSWER}))
        out.append(_sse("response.output_text.done", {"type": "response.output_text.done", "sequence_number": next(seq),
                                                      "item_id": mid, "output_index": 0, "content_index": 0, "text": ANSWER}))
        out.append(_sse("response.content_part.done", {"type": "response.content_part.done", "sequence_number": next(seq),
                                                       "item_id": mid, "output_index": 0, "content_index": 0, "part": part}))
    out.append(_sse("response.output_item.done", {"type": "response.output_item.done", "sequence_number": next(seq),
                                                  "output_index": 0, "item": item}))
    done = dict(base, status="completed", output=[item], usage={
        "input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15})
    out.append(_sse("response.completed", {"type": "response.completed", "sequence_number": next(seq), "response": done}))
    return out


# --------------------------------------------------------------------------------------------


def _without(events: list[str], drop: frozenset[str]) -> list[str]:
    """Probe mode: leave out some SSE event types to learn which ones a harness needs."""
    def kind(event: str) -> str:
        data = event.split("data: ", 1)[1]
        return "" if data.startswith("[DONE]") else json.loads(data).get("type", "")
    return [e for e in events if kind(e) not in drop]


def create_capture_app(log_path: Path, command: str, drop: frozenset[str] = frozenset(),
                       probe_status: int = 200) -> Starlette:
    lock = threading.Lock()

    async def handle(request: Request) -> Response:
        raw = await request.body()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = {"_raw": raw[:2000].decode("utf-8", "replace")}
        entry = {"t": time.time(), "method": request.method, "path": request.url.path,
                 "query": request.url.query, "headers": dict(request.headers), "body": body}
        with lock, log_path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")
        path = request.url.path
        if request.method in ("HEAD", "GET") and not path.endswith("/models"):
            return Response(status_code=probe_status)
        if path.endswith("/models"):
            return JSONResponse({"object": "list", "data": [{"id": "forge-policy", "object": "model",
                                                             "created": 0, "owned_by": "openforge"}]})
        if path.endswith("/messages/count_tokens"):
            return JSONResponse({"input_tokens": 10})
        if path.endswith("/messages"):
            blocks = _anthropic_blocks(body, command)
            if body.get("stream"):
                return StreamingResponse(iter(_without(anthropic_stream(body, blocks), drop)), media_type="text/event-stream")
            stop = "tool_use" if blocks[0]["type"] == "tool_use" else "end_turn"
            return JSONResponse({"id": f"msg_{uuid.uuid4().hex[:20]}", "type": "message", "role": "assistant",
                                 "model": body.get("model", "m"), "content": blocks, "stop_reason": stop,
                                 "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 5}})
        if path.endswith("/chat/completions"):
            message = chat_reply(body, command)
            if body.get("stream"):
                return StreamingResponse(iter(_without(chat_stream(body, message), drop)), media_type="text/event-stream")
            finish = "tool_calls" if message.get("tool_calls") else "stop"
            return JSONResponse({"id": f"chatcmpl-{uuid.uuid4().hex[:20]}", "object": "chat.completion",
                                 "created": int(time.time()), "model": body.get("model", "m"),
                                 "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                                 "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})
        if path.endswith("/responses"):
            return StreamingResponse(iter(_without(responses_stream(body, command), drop)), media_type="text/event-stream")
        return JSONResponse({"error": {"message": f"capture server: no route {path}"}}, status_code=404)

    methods = ["GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS"]
    return Starlette(routes=[Route("/{path:path}", handle, methods=methods)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--log", type=Path, required=True)
    ap.add_argument("--command", default="echo captured > captured.txt")
    ap.add_argument("--drop", action="append", default=[], help="an SSE event type to leave out (probe)")
    ap.add_argument("--probe-status", type=int, default=200, help="status for HEAD/GET probes")
    args = ap.parse_args()
    uvicorn.run(create_capture_app(args.log, args.command, frozenset(args.drop), args.probe_status), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
