"""`ScriptedEngine`: SGLang's native API serving scripted completions, for deterministic tests.

The completions are strings (a list consumed in order, or a function of the prompt's token ids),
tokenised with the *real* tokenizer of a model directory and ended with its eos token, so everything
downstream (the proxy's detokenising, tool-call parsing, recording) runs on real token ids:

    engine = ScriptedEngine(tiny_model, ['<tool_call>\\n{"name": "bash", "arguments": {"command": "ls"}}\\n</tool_call>',
                                         "All done."])
    with serve_in_thread(engine.app) as server: ...

Logprobs are deterministic: `scripted_logprob(token_id, position)`. Faults for fault tests are queued
with `engine.fail_next(...)`: an HTTP 500, a connection dropped after N streamed tokens, or a delay.
Every /generate body received is kept in `engine.requests`.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.protocol import (
    SSE_DONE,
    BadRequest,
    CompletionState,
    error_response,
    output_chunk,
    parse_input_ids,
    parse_sampling_params,
    read_json,
    sse,
)
from openforge.errors import EngineError

Script = list[str] | Callable[[list[int]], str]


def scripted_logprob(token_id: int, position: int) -> float:
    """A deterministic, token-dependent logprob in [-2.0, -0.1]."""
    return -round(0.1 + ((token_id * 31 + position * 7) % 20) / 10.5, 6)


@dataclass
class Fault:
    """What the next /generate does instead of answering normally."""

    kind: Literal["http_500", "disconnect", "delay"]
    after_tokens: int = 0  # disconnect: tokens streamed before the connection drops
    seconds: float = 0.0  # delay: sleep before answering


class _Disconnect(Exception):
    """Raised inside a response body: uvicorn then drops the connection mid-response."""


class ScriptedEngine:
    """A Starlette app (`.app`) speaking the SGLang subset, answering from `script`."""

    def __init__(self, model_path: str | Path, script: Script, *, model_name: str = "scripted",
                 token_delay_s: float = 0.0, incremental_stream: bool = False) -> None:
        from transformers import AutoTokenizer

        path = Path(model_path).expanduser()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        except (OSError, ValueError) as exc:
            raise EngineError(f"cannot load a tokenizer from {path}: {str(exc).splitlines()[0]}") from None
        self.model_path = str(path)
        self.model_name = model_name
        self.eos_id = int(self.tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in self.tokenizer.get_vocab()
                          else self.tokenizer.eos_token_id)
        self.script = script if callable(script) else deque(script)
        self.token_delay_s = token_delay_s
        # SGLang's --incremental-streaming-output: chunks hold only the new tokens (default: cumulative).
        self.incremental_stream = incremental_stream
        self.requests: list[dict[str, Any]] = []
        self.adapters: dict[str, str] = {}
        self.weight_paths: list[str] = []  # every /update_weights_from_disk model_path, in order
        self.faults: deque[Fault] = deque()
        self._lock = threading.Lock()
        self.app = Starlette(routes=[
            Route("/generate", self._generate, methods=["POST", "PUT"]),
            Route("/health", self._health, methods=["GET"]),
            Route("/health_generate", self._health, methods=["GET"]),
            Route("/model_info", self._model_info, methods=["GET"]),
            Route("/get_model_info", self._model_info, methods=["GET"]),
            Route("/load_lora_adapter", self._load_lora, methods=["POST"]),
            Route("/unload_lora_adapter", self._unload_lora, methods=["POST"]),
            Route("/update_weights_from_disk", self._update_weights, methods=["POST"]),
            Route("/flush_cache", self._flush_cache, methods=["GET", "POST"]),
        ])

    # -- test hooks -------------------------------------------------------------------------

    def fail_next(self, kind: Literal["http_500", "disconnect", "delay"] = "http_500", *,
                  after_tokens: int = 0, seconds: float = 0.0) -> None:
        """Queue a fault for the next /generate request."""
        self.faults.append(Fault(kind, after_tokens, seconds))

    def completion_ids(self, text: str) -> list[int]:
        """The token ids a scripted completion string is served as (text tokens + eos)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False)) + [self.eos_id]

    # -- routes -----------------------------------------------------------------------------

    def _next_text(self, input_ids: list[int]) -> str:
        with self._lock:
            if callable(self.script):
                return self.script(input_ids)
            if not self.script:
                raise BadRequest("the scripted engine has no completions left")
            return self.script.popleft()

    async def _generate(self, request: Request) -> Response:
        try:
            body = await read_json(request)
            self.requests.append(body)
            input_ids = parse_input_ids(body, len(self.tokenizer))
            params = parse_sampling_params(body.get("sampling_params"))
            lora = body.get("lora_path")
            if lora is not None and lora not in self.adapters:
                raise BadRequest(f"LoRA adapter {lora!r} is not loaded")
            fault = self.faults.popleft() if self.faults else None
            if fault and fault.kind == "http_500":
                return error_response("scripted fault: internal error", 500)
            if fault and fault.kind == "delay":
                await asyncio.sleep(fault.seconds)
            state = CompletionState(params, {self.eos_id}, self._decode(params))
            tokens = self.completion_ids(self._next_text(input_ids))
        except BadRequest as exc:
            return error_response(str(exc))
        rid = str(body.get("rid") or uuid.uuid4().hex)
        chunk = lambda: output_chunk(  # noqa: E731 - one shape for both paths
            rid=rid, text=state.text(), output_ids=state.output_ids, logprobs=state.logprobs,
            prompt_tokens=len(input_ids), finish=state.finish, return_logprob=bool(body.get("return_logprob")),
        )
        drop_after = fault.after_tokens if fault and fault.kind == "disconnect" else None
        if not body.get("stream"):
            if drop_after is not None:
                return StreamingResponse(self._broken_body(), media_type="application/json")
            for i, tid in enumerate(tokens):
                if state.finish or state.append(tid, scripted_logprob(tid, i)):
                    break
            return JSONResponse(chunk())
        return StreamingResponse(self._stream(state, tokens, chunk, drop_after), media_type="text/event-stream")

    async def _stream(self, state: CompletionState, tokens: list[int], chunk: Callable[[], dict],
                      drop_after: int | None):
        for i, tid in enumerate(tokens):
            if state.finish:
                break
            if drop_after is not None and i >= drop_after:
                raise _Disconnect("scripted fault: connection dropped mid-stream")
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)
            state.append(tid, scripted_logprob(tid, i))
            out = chunk()
            if self.incremental_stream:
                out["output_ids"] = out["output_ids"][i:]
                out["meta_info"]["output_token_logprobs"] = out["meta_info"].get("output_token_logprobs", [])[i:]
            yield sse(out)
        yield SSE_DONE

    async def _broken_body(self):
        raise _Disconnect("scripted fault: connection dropped before the answer")
        yield b""  # pragma: no cover - makes this an async generator

    def _decode(self, params: Any) -> Callable[[list[int]], str]:
        skip = params.skip_special_tokens
        return lambda ids: self.tokenizer.decode(ids, skip_special_tokens=skip)

    async def _health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def _model_info(self, request: Request) -> Response:
        return JSONResponse({
            "model_path": self.model_path, "tokenizer_path": self.model_path, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": "default", "served_model_name": self.model_name,
        })

    async def _load_lora(self, request: Request) -> Response:
        try:
            body = await read_json(request)
        except BadRequest as exc:
            return error_response(str(exc))
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            return JSONResponse({"success": False, "error_message": "lora_name and lora_path are required",
                                 "loaded_adapters": dict(self.adapters)}, status_code=400)
        self.adapters[str(name)] = str(path)
        return JSONResponse({"success": True, "error_message": None, "loaded_adapters": dict(self.adapters)})

    async def _unload_lora(self, request: Request) -> Response:
        try:
            body = await read_json(request)
        except BadRequest as exc:
            return error_response(str(exc))
        name = body.get("lora_name")
        if name not in self.adapters:
            return JSONResponse({"success": False, "error_message": f"LoRA adapter {name!r} is not loaded",
                                 "loaded_adapters": dict(self.adapters)}, status_code=400)
        del self.adapters[name]
        return JSONResponse({"success": True, "error_message": None, "loaded_adapters": dict(self.adapters)})

    async def _update_weights(self, request: Request) -> Response:
        try:
            body = await read_json(request)
        except BadRequest as exc:
            return error_response(str(exc))
        path = body.get("model_path")
        if not isinstance(path, str) or not path:
            return JSONResponse({"success": False, "message": "model_path must be a non-empty string",
                                 "num_paused_requests": 0}, status_code=400)
        self.weight_paths.append(path)
        return JSONResponse({"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0})

    async def _flush_cache(self, request: Request) -> Response:
        return PlainTextResponse("Cache flushed.\n")

