"""`EngineClient`: the one client of SGLang's native HTTP API, used by the proxy and the trainer.

It talks to either engine (the embedded one or a real SGLang server) with the same JSON:

    POST /generate {"input_ids": [...], "sampling_params": {...}, "return_logprob": true,
                    "lora_path": "adapter-name" | null, "rid": "...", "stream": bool}
    -> {"text": ..., "output_ids": [...],
        "meta_info": {"id", "finish_reason": {"type": "stop"|"length"|"abort", "matched"?: int|str},
                      "prompt_tokens", "completion_tokens",
                      "output_token_logprobs": [[logprob, token_id, text|None], ...], ...}}

Streaming answers `data: {same object}` SSE lines and ends with `data: [DONE]`. SGLang's chunks are
*cumulative* by default (`output_ids` and `output_token_logprobs` hold everything so far) and
*incremental* under `--incremental-streaming-output`; `stream_generate` accepts both (it tells them
apart by `meta_info.completion_tokens`) and always yields incremental deltas.

Errors are typed (openforge.errors), so callers decide by class, never by message text:

    EngineUnavailable   cannot connect (after retries), the connection broke, or HTTP 5xx
    EngineTimeout       no answer, or a stream stalled, within `timeout`
    EngineRejected      HTTP 4xx (or an error chunk in a stream: SGLang's validation errors)

Only failures where the request cannot have been processed are retried: a refused connection (with
backoff), and once, a kept-alive connection the engine closed as the request went out (see
`KEEPALIVE_EXPIRY_S`).

With `api_key`, every request carries `Authorization: Bearer <key>` (SGLang's `--api-key`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from openforge.errors import EngineError, EngineRejected, EngineTimeout, EngineUnavailable

_NOT_CONNECTED = (httpx.ConnectError, httpx.ConnectTimeout)
# The request went out on a kept-alive connection that the server closed at the same moment: no
# response at all. The server never read it (uvicorn closes idle connections without reading).
_DROPPED_BEFORE_ANSWER = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)

# Both uvicorn (the embedded engine, SGLang's server) and httpx drop idle keep-alive connections
# after 5 s. With equal timers a request sent on a connection idle for ~5 s races the server's close
# and fails with no response (about 1 call in 1,000-2,500 under load). Expiring our side well before
# the server's leaves the race a window of scheduler delay only, and the one retry on
# `_DROPPED_BEFORE_ANSWER` covers that.
KEEPALIVE_EXPIRY_S = 2.0


@dataclass
class GenerateOutput:
    """One finished completion: the sampled token ids with their logprobs."""

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # 'stop' | 'length' | 'abort'
    matched_stop: int | str | None
    prompt_tokens: int
    completion_tokens: int
    text: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class GenerateDelta:
    """New tokens since the previous delta. `finish_reason` is set on the last one only."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None = None
    matched_stop: int | str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def _finish(meta: dict[str, Any]) -> tuple[str | None, int | str | None]:
    reason = meta.get("finish_reason")
    if reason is None:
        return None, None
    if isinstance(reason, str):  # some SGLang versions flatten it
        return reason, meta.get("matched_stop")
    return str(reason.get("type", "abort")), reason.get("matched")


def _logprobs(meta: dict[str, Any]) -> list[float]:
    return [float(entry[0]) if entry[0] is not None else float("nan")
            for entry in meta.get("output_token_logprobs") or []]


def parse_generate_response(body: dict[str, Any]) -> GenerateOutput:
    """A non-streaming /generate answer -> GenerateOutput (raises EngineRejected on an error body)."""
    if "error" in body:
        raise EngineRejected(f"engine refused the request: {_error_message(body)}")
    meta = body.get("meta_info") or {}
    ids = [int(t) for t in body.get("output_ids") or []]
    reason, matched = _finish(meta)
    return GenerateOutput(
        output_ids=ids,
        logprobs=_logprobs(meta),
        finish_reason=reason or "abort",
        matched_stop=matched,
        prompt_tokens=int(meta.get("prompt_tokens") or 0),
        completion_tokens=int(meta.get("completion_tokens") or len(ids)),
        text=body.get("text") or "",
        meta=meta,
    )


def _error_message(body: Any) -> str:
    if isinstance(body, dict):
        if body.get("error_message"):  # SGLang's LoRA answers: {"success": false, "error_message": ...}
            return str(body["error_message"])
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("message") or err)
        if body.get("error_message"):
            return str(body["error_message"])
        return str(err)
    return str(body)


class _DeltaTracker:
    """Turns SGLang stream chunks (cumulative or incremental) into incremental deltas."""

    def __init__(self) -> None:
        self.seen_ids = 0
        self.seen_lps = 0

    def delta(self, chunk: dict[str, Any]) -> GenerateDelta:
        meta = chunk.get("meta_info") or {}
        reason, matched = _finish(meta)
        ids = [int(t) for t in chunk.get("output_ids") or []]
        total = meta.get("completion_tokens")
        if total is not None and len(ids) == int(total) and len(ids) >= self.seen_ids:
            new_ids = ids[self.seen_ids:]  # cumulative chunk
        elif reason == "abort":
            new_ids = []  # SGLang's abort chunk repeats the last token only: nothing new
        else:
            new_ids = ids
        lps = _logprobs(meta)
        # Same test for logprobs: a cumulative list is as long as the completion so far.
        new_lps = lps[self.seen_lps:] if total is not None and len(lps) == int(total) else lps
        if reason == "abort" and not new_ids:
            new_lps = []
        self.seen_ids += len(new_ids)
        self.seen_lps += len(new_lps)
        return GenerateDelta(new_ids, new_lps, reason, matched, meta if reason else {})


class EngineClient:
    """Async client of one engine at `base_url` (SGLang's native API).

    `transport` replaces the network (e.g. `httpx.ASGITransport(app=engine.app)` in tests)."""

    def __init__(self, base_url: str, *, timeout: float = 300, retries: int = 3, api_key: str | None = None,
                 transport: httpx.AsyncBaseTransport | None = None,
                 keepalive_expiry: float = KEEPALIVE_EXPIRY_S) -> None:
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self.timeout = timeout
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout, connect=min(10.0, timeout)),
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=64, keepalive_expiry=keepalive_expiry),
            headers={"authorization": f"Bearer {api_key}"} if api_key else None,
            transport=transport,
        )

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- plumbing ---------------------------------------------------------------------------

    async def _send(self, method: str, path: str, *, json_body: Any = None, stream: bool = False) -> httpx.Response:
        """Send with the retries above; the caller closes a streamed response."""
        resp = await self._open(method, path, json_body)
        if not stream:
            try:
                await resp.aread()
            except httpx.TimeoutException:
                raise EngineTimeout(f"engine at {self.base_url} did not answer {path} within {self.timeout:g}s") \
                    from None
            except httpx.HTTPError as exc:
                raise EngineUnavailable(f"engine at {self.base_url} broke off {path}: {type(exc).__name__}: {exc}") \
                    from None
            finally:
                await resp.aclose()
        return resp

    async def _open(self, method: str, path: str, json_body: Any) -> httpx.Response:
        """The response's head (its body still to read). Retries stop here: once the engine has
        answered, it has the request, and sending it again could run it twice."""
        delay = 0.2
        redone = False
        attempt = 0
        while True:
            try:
                req = self._http.build_request(method, path, json=json_body)
                return await self._http.send(req, stream=True)
            except _NOT_CONNECTED as exc:
                if attempt == self.retries:
                    raise EngineUnavailable(
                        f"engine at {self.base_url} is down (cannot connect after {attempt + 1} tries: "
                        f"{type(exc).__name__})"
                    ) from None
                attempt += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
            except httpx.TimeoutException:
                raise EngineTimeout(f"engine at {self.base_url} did not answer {path} within {self.timeout:g}s") from None
            except _DROPPED_BEFORE_ANSWER as exc:
                if redone:
                    raise EngineUnavailable(f"engine at {self.base_url} dropped {path}: {type(exc).__name__}: {exc}") \
                        from None
                redone = True  # at once, on a fresh connection: the pool discards the dead one
            except httpx.HTTPError as exc:
                raise EngineUnavailable(f"engine at {self.base_url} failed {path}: {type(exc).__name__}: {exc}") \
                    from None

    def _check(self, resp: httpx.Response, path: str) -> None:
        if resp.status_code >= 400:
            try:
                detail = _error_message(resp.json())
            except (json.JSONDecodeError, UnicodeDecodeError):
                detail = resp.text.strip()[:300]
            message = f"engine at {self.base_url}: {path} -> HTTP {resp.status_code}: {detail}"
            if resp.status_code < 500:
                raise EngineRejected(message, status=resp.status_code)
            raise EngineUnavailable(message)

    async def _call(self, method: str, path: str, json_body: Any = None) -> httpx.Response:
        resp = await self._send(method, path, json_body=json_body)
        self._check(resp, path)
        return resp

    @staticmethod
    def _generate_body(input_ids: list[int], sampling_params: dict[str, Any], lora_path: str | None,
                       rid: str | None, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "input_ids": list(input_ids),
            "sampling_params": dict(sampling_params),
            "return_logprob": True,
            "return_text_in_logprobs": False,
            "stream": stream,
        }
        if lora_path is not None:
            body["lora_path"] = lora_path
        if rid is not None:
            body["rid"] = rid
        return body

    # -- generation -------------------------------------------------------------------------

    async def generate(self, input_ids: list[int], sampling_params: dict[str, Any], *,
                       lora_path: str | None = None, rid: str | None = None) -> GenerateOutput:
        """One completion of `input_ids`; `lora_path` names a loaded adapter (None = base model)."""
        resp = await self._call("POST", "/generate", self._generate_body(input_ids, sampling_params, lora_path, rid, False))
        try:
            body = resp.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise EngineUnavailable(f"engine at {self.base_url}: /generate answered non-JSON: {resp.text[:200]!r}") \
                from None
        return parse_generate_response(body)

    async def stream_generate(self, input_ids: list[int], sampling_params: dict[str, Any], *,
                              lora_path: str | None = None, rid: str | None = None) -> AsyncIterator[GenerateDelta]:
        """Yield incremental `GenerateDelta`s; the last one carries `finish_reason`.

        A stream that ends without a finish reason (the engine died) raises EngineUnavailable."""
        resp = await self._send("POST", "/generate", json_body=self._generate_body(input_ids, sampling_params, lora_path, rid, True),
                                stream=True)
        try:
            if resp.status_code >= 400:
                await resp.aread()
                self._check(resp, "/generate")
            tracker = _DeltaTracker()
            finished = False
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                if "error" in chunk:  # SGLang streams its validation errors (ValueError) this way
                    raise EngineRejected(f"engine at {self.base_url}: /generate stream failed: {_error_message(chunk)}")
                delta = tracker.delta(chunk)
                finished = delta.finish_reason is not None
                if delta.token_ids or finished:
                    yield delta
            if not finished:
                raise EngineUnavailable(f"engine at {self.base_url}: /generate stream ended before the completion "
                                        "finished")
        except json.JSONDecodeError as exc:
            raise EngineUnavailable(f"engine at {self.base_url}: bad stream chunk: {exc}") from None
        except httpx.TimeoutException:
            raise EngineTimeout(f"engine at {self.base_url}: /generate stream stalled for {self.timeout:g}s") from None
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"engine at {self.base_url}: /generate stream broke: {type(exc).__name__}: {exc}") \
                from None
        finally:
            await resp.aclose()

    # -- control ----------------------------------------------------------------------------

    async def _admin(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        resp = await self._call("POST", path, body)
        try:
            out = resp.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return {"success": True, "message": resp.text}
        if isinstance(out, dict) and out.get("success") is False:
            raise EngineRejected(f"engine at {self.base_url}: {path} failed: {_error_message(out)}")
        return out

    async def load_lora_adapter(self, name: str, path: str) -> dict[str, Any]:
        """Load (or replace) adapter `name` from the PEFT folder `path` without a restart."""
        return await self._admin("/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})

    async def unload_lora_adapter(self, name: str) -> dict[str, Any]:
        return await self._admin("/unload_lora_adapter", {"lora_name": name})

    async def update_weights_from_disk(self, path: str) -> dict[str, Any]:
        """Replace the base weights with the checkpoint at `path` (same architecture)."""
        return await self._admin("/update_weights_from_disk", {"model_path": str(path)})

    async def flush_cache(self) -> None:
        await self._call("POST", "/flush_cache")

    async def model_info(self) -> dict[str, Any]:
        return (await self._call("GET", "/model_info")).json()

    async def context_length(self) -> int | None:
        """The longest sequence (prompt + completion) the engine serves, as it reports it; None when
        it reports none. The embedded engine answers `context_length` on /model_info (from the model
        config); SGLang's /get_server_info has `context_length` (its server arg, may be null),
        `max_total_num_tokens` (the KV cache's size) and `max_req_input_len` (the longest prompt:
        min(the model's context, the KV cache) - 1); older versions only /get_model_info."""
        for path in ("/model_info", "/get_server_info", "/get_model_info"):
            try:
                info = (await self._call("GET", path)).json()
            except (EngineRejected, json.JSONDecodeError, UnicodeDecodeError):  # no such route here
                continue
            if not isinstance(info, dict):
                continue
            found = [info[k] + extra for k, extra in (("context_length", 0), ("max_total_num_tokens", 0),
                                                      ("max_req_input_len", 1))
                     if isinstance(info.get(k), int) and not isinstance(info[k], bool) and info[k] > 0]
            if found:
                return min(found)
        return None

    async def health(self) -> bool:
        """True when the engine answers /health with 200 (no retries: this is a probe)."""
        try:
            resp = await self._http.get("/health", timeout=5.0)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    async def wait_healthy(self, timeout: float) -> None:
        """Poll /health until it answers 200, or raise EngineError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            if await self.health():
                return
            if time.monotonic() >= deadline:
                raise EngineUnavailable(f"engine at {self.base_url} did not become healthy within {timeout:g}s")
            await asyncio.sleep(0.1)
