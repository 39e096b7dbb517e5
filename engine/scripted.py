"""`ScriptedEngine`: SGLang's native API serving scripted completions, for deterministic tests.

The completions are strings (a list consumed in order, or a function of the prompt's token ids),
tokenised with the *real* tokenizer of a model directory and ended with its eos token, so everything
downstream (the proxy's detokenising, tool-call parsing, recording) runs on real token ids:

    engine = ScriptedEngine(tiny_model, ['<tool_call>\\n{"name": "bash", "arguments": {"command": "ls"}}\\n</tool_call>',
                                         "All done."])
    with serve_in_thread(engine.app) as server: ...

Logprobs are deterministic: `scripted_logprob(token_id, position)`. Faults for fault tests are queued
with `engine.fail_next(...)`: an HTTP 500, a connection dropped after N streamed tokens, or a delay.
Every /generate body received is kept in `engine.requests`. The HTTP side is engine/sglang_api.py's
(the same app as the embedded engine's); `api_key=` guards it like SGLang's `--api-key`.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from openforge.engine.protocol import BadRequest, CompletionState, finish_json, parse_input_ids, parse_sampling_params
from openforge.engine.sglang_api import DropConnection, StaticInfo, create_sglang_app
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


@dataclass
class _ScriptedGeneration:
    """One scripted completion, produced token by token (`openforge.engine.sglang_api.Generation`)."""

    rid: str
    prompt_tokens: int
    state: CompletionState
    tokens: list[int]
    drop_after: int | None
    token_delay_s: float

    async def updates(self) -> AsyncIterator[tuple[int, dict[str, Any] | None]]:
        for i, tid in enumerate(self.tokens):
            if self.state.finish:
                break
            if self.drop_after is not None and i >= self.drop_after:
                raise DropConnection("scripted fault: connection dropped mid-stream")
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)
            self.state.append(tid, scripted_logprob(tid, i))
            if self.state.finish is None and i == len(self.tokens) - 1:  # script ran out (ignore_eos)
                self.state.finish = finish_json("length", length=i + 1)
            yield i + 1, self.state.finish

    def abort(self) -> None:
        pass  # nothing runs in the background

    def meta(self) -> dict[str, Any]:
        return {}


class ScriptedEngine(StaticInfo):
    """An SGLang-API backend answering from `script`; `.app` is its Starlette app."""

    info_version = "scripted"

    def __init__(self, model_path: str | Path, script: Script, *, model_name: str = "scripted",
                 token_delay_s: float = 0.0, incremental_stream: bool = False, api_key: str = "") -> None:
        from transformers import AutoTokenizer

        path = Path(model_path).expanduser()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        except (OSError, ValueError) as exc:
            raise EngineError(f"cannot load a tokenizer from {path}: {str(exc).splitlines()[0]}") from None
        self.model_path = str(path)
        self.model_name = model_name
        self.context_length = _context_length(path)
        self.eos_id = int(self.tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in self.tokenizer.get_vocab()
                          else self.tokenizer.eos_token_id)
        self.script = script if callable(script) else deque(script)
        self.token_delay_s = token_delay_s  # between streamed tokens
        # SGLang's --incremental-streaming-output: chunks hold only the new tokens (default: cumulative).
        self.incremental_stream = incremental_stream
        self.requests: list[dict[str, Any]] = []
        self.adapters: dict[str, str] = {}
        self.weight_paths: list[str] = []  # every /update_weights_from_disk model_path, in order
        self.faults: deque[Fault] = deque()
        self._lock = threading.Lock()
        self.app = create_sglang_app(self, api_key=api_key)

    # -- test hooks -------------------------------------------------------------------------

    def fail_next(self, kind: Literal["http_500", "disconnect", "delay"] = "http_500", *,
                  after_tokens: int = 0, seconds: float = 0.0) -> None:
        """Queue a fault for the next /generate request."""
        self.faults.append(Fault(kind, after_tokens, seconds))

    def completion_ids(self, text: str) -> list[int]:
        """The token ids a scripted completion string is served as (text tokens + eos)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False)) + [self.eos_id]

    def _next_text(self, input_ids: list[int]) -> str:
        with self._lock:
            if callable(self.script):
                return self.script(input_ids)
            if not self.script:
                raise BadRequest("the scripted engine has no completions left")
            return self.script.popleft()

    # -- the backend protocol (engine.sglang_api.SGLangBackend) -----------------------------

    async def start(self, body: dict[str, Any]) -> _ScriptedGeneration:
        self.requests.append(body)
        input_ids = parse_input_ids(body, len(self.tokenizer))
        params = parse_sampling_params(body.get("sampling_params"))
        lora = body.get("lora_path")
        if lora is not None and lora not in self.adapters:
            raise BadRequest(f"LoRA adapter {lora!r} is not loaded")
        fault = self.faults.popleft() if self.faults else None
        if fault and fault.kind == "http_500":
            raise BadRequest("scripted fault: internal error", 500)
        if fault and fault.kind == "delay":
            await asyncio.sleep(fault.seconds)
        skip = params.skip_special_tokens
        state = CompletionState(params, {self.eos_id}, lambda ids: self.tokenizer.decode(ids, skip_special_tokens=skip))
        return _ScriptedGeneration(
            rid=str(body.get("rid") or uuid.uuid4().hex), prompt_tokens=len(input_ids), state=state,
            tokens=self.completion_ids(self._next_text(input_ids)),
            drop_after=fault.after_tokens if fault and fault.kind == "disconnect" else None,
            token_delay_s=self.token_delay_s if body.get("stream") else 0.0)

    def loaded_adapters(self) -> dict[str, str]:
        return dict(self.adapters)

    async def load_lora(self, name: str, path: str) -> str | None:
        self.adapters[name] = path
        return None

    async def unload_lora(self, name: str) -> str | None:
        del self.adapters[name]
        return None

    async def update_weights(self, path: str, weight_version: str | None) -> str | None:
        self.weight_paths.append(path)
        return None

    async def flush_cache(self) -> bool:
        return True

    def close(self) -> None:
        pass


def _context_length(path: Path) -> int:
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return 32768
    return int(config.get("max_position_embeddings") or 32768)
