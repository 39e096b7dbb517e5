"""The server side of SGLang's native API subset, shared by the embedded and the scripted engine.

Shapes follow SGLang's `http_server.py` / `tokenizer_manager.py`: errors are `{"error": {"message"}}`
with HTTP 400; a stream is `data: <json>\\n\\n` lines ending in `data: [DONE]`. A chunk is either
cumulative (SGLang's default: `output_ids`, `text` and `meta_info.output_token_logprobs` hold
everything so far) or incremental (SGLang's `--incremental-streaming-output`: only the new part);
`meta_info.completion_tokens` always counts them all. `finish_reason` is None until the last chunk,
then `{"type": "stop", "matched": id|str}`, `{"type": "length", "length": n}` or
`{"type": "abort", "message": ...}`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse


class BadRequest(ValueError):
    """A request the engine refuses, with HTTP 400 unless told (SGLang raises ValueError for these)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def error_response(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


async def read_json(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadRequest("request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


@dataclass
class SamplingParams:
    """The subset of SGLang's `sampling_params` the engines honour (others are ignored, like SGLang)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_new_tokens: int = 128
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None

    @property
    def greedy(self) -> bool:
        # SGLang treats temperature < 1e-6 (or top_k == 1) as greedy.
        return self.temperature < 1e-6 or self.top_k == 1


def _number(raw: dict[str, Any], key: str, default: Any, kind: type) -> Any:
    value = raw.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"sampling_params.{key} must be a number, got {value!r}")
    if kind is int and float(value) != int(value):
        raise BadRequest(f"sampling_params.{key} must be an integer, got {value!r}")
    return kind(value)


def parse_sampling_params(raw: Any, *, default_max_new_tokens: int = 128) -> SamplingParams:
    """Validate like SGLang's `SamplingParams.verify` and return the typed params."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise BadRequest("sampling_params must be a JSON object")
    stop = raw.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    stop_ids = raw.get("stop_token_ids") or []
    if not all(isinstance(s, str) for s in stop) or not all(isinstance(t, int) for t in stop_ids):
        raise BadRequest("sampling_params.stop must be strings and stop_token_ids integers")
    seed = raw.get("sampling_seed")
    p = SamplingParams(
        temperature=_number(raw, "temperature", 1.0, float),
        top_p=_number(raw, "top_p", 1.0, float),
        top_k=_number(raw, "top_k", -1, int),
        min_p=_number(raw, "min_p", 0.0, float),
        max_new_tokens=_number(raw, "max_new_tokens", default_max_new_tokens, int),
        stop=list(stop),
        stop_token_ids=list(stop_ids),
        ignore_eos=bool(raw.get("ignore_eos", False)),
        skip_special_tokens=bool(raw.get("skip_special_tokens", True)),
        no_stop_trim=bool(raw.get("no_stop_trim", False)),
        sampling_seed=None if seed is None else int(seed),
    )
    if p.temperature < 0 or not math.isfinite(p.temperature):
        raise BadRequest(f"temperature must be non-negative, got {p.temperature}")
    if not 0 < p.top_p <= 1:
        raise BadRequest(f"top_p must be in (0, 1], got {p.top_p}")
    if p.top_k < 1 and p.top_k != -1:
        raise BadRequest(f"top_k must be -1 (disable), or at least 1, got {p.top_k}")
    if not 0 <= p.min_p <= 1:
        raise BadRequest(f"min_p must be in [0, 1], got {p.min_p}")
    if p.max_new_tokens < 0:
        raise BadRequest(f"max_new_tokens must be at least 0, got {p.max_new_tokens}")
    return p


def parse_input_ids(body: dict[str, Any], vocab_size: int) -> list[int]:
    ids = body.get("input_ids")
    if isinstance(ids, list) and ids and isinstance(ids[0], list):
        raise BadRequest("batched input_ids are not supported by this engine; send one request per prompt")
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise BadRequest("input_ids must be a non-empty list of token ids")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise BadRequest(f"input_ids has token id {bad[0]} outside the vocabulary (size {vocab_size})")
    return ids


def finish_json(kind: str, matched: int | str | None = None, length: int = 0, message: str = "") -> dict[str, Any]:
    if kind == "stop":
        return {"type": "stop", "matched": matched}
    if kind == "length":
        return {"type": "length", "length": length}
    return {"type": "abort", "message": message or "aborted"}


def output_chunk(*, rid: str, text: str, output_ids: list[int], logprobs: list[float], prompt_tokens: int,
                 finish: dict[str, Any] | None, return_logprob: bool, e2e_latency: float | None = None,
                 extra_meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """One /generate answer (or one cumulative stream chunk) in SGLang's shape."""
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(output_ids),
        "cached_tokens": 0,
    }
    if return_logprob:
        # [logprob, token_id, text]: text is None unless return_text_in_logprobs (not supported).
        meta["output_token_logprobs"] = [[lp, tid, None] for lp, tid in zip(logprobs, output_ids)]
    if e2e_latency is not None:
        meta["e2e_latency"] = e2e_latency
    if extra_meta:
        meta.update(extra_meta)
    return {"text": text, "output_ids": list(output_ids), "meta_info": meta}


def find_stop_string(text: str, stops: list[str]) -> tuple[int, str] | None:
    """The earliest stop string in `text`: (index, the string) or None."""
    best: tuple[int, str] | None = None
    for s in stops:
        if not s:
            continue
        i = text.find(s)
        if i >= 0 and (best is None or i < best[0]):
            best = (i, s)
    return best


class CompletionState:
    """One sequence's output so far and SGLang's finish rules, applied token by token.

    In SGLang's order (`Req.check_finished`): `max_new_tokens` first; then, unless `ignore_eos`, an
    eos or `stop_token_ids` token (kept in `output_ids`) - under `ignore_eos` SGLang ignores
    `stop_token_ids` too; then a stop string in the decoded text (its tokens kept, the text trimmed
    unless `no_stop_trim`), which `ignore_eos` does not turn off."""

    def __init__(self, params: SamplingParams, eos_ids: set[int], decode: Any) -> None:
        self.params = params
        self.stop_ids = set() if params.ignore_eos else set(params.stop_token_ids) | set(eos_ids)
        self.decode = decode  # list[int] -> str
        self.output_ids: list[int] = []
        self.logprobs: list[float] = []
        self.finish: dict[str, Any] | None = None
        self._stop_at: int | None = None
        if params.max_new_tokens == 0:
            self.finish = finish_json("length", length=0)

    def append(self, token_id: int, logprob: float) -> bool:
        """Add one sampled token; True when the sequence has finished."""
        self.output_ids.append(token_id)
        self.logprobs.append(logprob)
        if len(self.output_ids) >= self.params.max_new_tokens:
            self.finish = finish_json("length", length=len(self.output_ids))
        elif token_id in self.stop_ids:
            self.finish = finish_json("stop", matched=token_id)
        elif self.params.stop:
            hit = find_stop_string(self.decode(self.output_ids), self.params.stop)
            if hit is not None:
                self.finish = finish_json("stop", matched=hit[1])
                self._stop_at = hit[0] + (len(hit[1]) if self.params.no_stop_trim else 0)
        return self.finish is not None

    def text(self) -> str:
        ids = self.output_ids
        if self.finish and self.finish["type"] == "stop" and isinstance(self.finish["matched"], int) \
                and not self.params.no_stop_trim and ids:
            ids = ids[:-1]  # SGLang trims the matched stop token from the text
        text = self.decode(ids)
        return text[: self._stop_at] if self._stop_at is not None else text
