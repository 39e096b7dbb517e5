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

With `api_key`, every request carries `Authorization: Bearer <key>` (SGLang's `--api-key`). With
`routing_key`, a /generate carries `X-SMG-Routing-Key: <key>`: sglang-router's `manual` policy keeps
every request with one key on one worker (the proxy passes the rollout id, so a rollout's turns find
their prefix in that worker's cache); an engine without a router ignores it.

The one network path is aiohttp, in production and in tests alike (tests serve an engine on
loopback): its connection pool hands out a kept-alive connection in O(1), where httpx's pool checked
every idle connection with a syscall on each request, a tenth of the proxy's CPU per call.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from openforge.errors import EngineError, EngineRejected, EngineTimeout, EngineUnavailable

ROUTING_KEY_HEADER = "X-SMG-Routing-Key"  # sglang-router's `manual` policy routes by this header

# SGLang's server (uvicorn's default) drops idle keep-alive connections after 5 s (the embedded
# engine and the proxy keep them for engine.serve.KEEP_ALIVE_S). With equal timers a request sent on a connection idle for ~5 s races the server's close
# and fails with no response (about 1 call in 1,000-2,500 under load). Expiring our side well before
# the server's leaves the race a window of scheduler delay only, and the one retry on a dropped
# request covers that.
KEEPALIVE_EXPIRY_S = 2.0


class _NotConnected(Exception):
    """No connection could be made: the request never left."""


class _Dropped(Exception):
    """The request went out on a kept-alive connection that the server closed at the same moment: no
    response at all. The server never read it (uvicorn closes idle connections without reading)."""


class _TimedOut(Exception):
    pass


class _Broken(Exception):
    """Any other transport failure."""


class _Reply:
    """An answered request: its status, then its body (whole, or line by line for a stream)."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status

    async def read(self) -> bytes:
        try:
            return await self._resp.read()
        except TimeoutError as exc:
            raise _TimedOut() from exc
        except aiohttp.ClientError as exc:
            raise _Broken(f"{type(exc).__name__}: {exc}") from exc

    async def lines(self) -> AsyncIterator[bytes]:
        # Split here rather than with aiohttp's readline, which refuses lines over 128 KiB (a
        # cumulative chunk's logprobs grow past that on long completions).
        buf = b""
        try:
            async for part in self._resp.content.iter_any():
                buf += part
                if b"\n" in buf:
                    *done, buf = buf.split(b"\n")
                    for line in done:
                        yield line.rstrip(b"\r")
        except TimeoutError as exc:
            raise _TimedOut() from exc
        except aiohttp.ClientError as exc:
            raise _Broken(f"{type(exc).__name__}: {exc}") from exc
        if buf:
            yield buf

    async def close(self) -> None:
        if self._resp.content.at_eof():
            self._resp.release()  # the connection goes back to the pool
        else:
            self._resp.close()  # a body left unread (a stream abandoned): the connection is dropped


class _Sender:
    """Requests over aiohttp's pool (made on first use: aiohttp binds it to the running loop)."""

    def __init__(self, base_url: str, timeout: float, headers: dict[str, str],
                 keepalive_expiry: float) -> None:
        self.base_url = base_url
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=min(10.0, timeout), sock_read=timeout)
        self.headers = headers
        self.keepalive_expiry = keepalive_expiry
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _open_session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            connector = aiohttp.TCPConnector(limit=512, keepalive_timeout=self.keepalive_expiry,
                                             ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(self.base_url, connector=connector, timeout=self.timeout,
                                                  headers=self.headers, auto_decompress=False,
                                                  skip_auto_headers=("User-Agent",))
            self._loop = loop
        return self._session

    async def send(self, method: str, path: str, body: bytes | None, timeout: float | None,
                   headers: dict[str, str] | None = None) -> _Reply:
        session = self._open_session()
        sent = dict(headers or {})
        kw: dict[str, Any] = {}
        if body is not None:
            kw["data"] = body
            sent["content-type"] = "application/json"
        if sent:
            kw["headers"] = sent
        if timeout is not None:
            kw["timeout"] = aiohttp.ClientTimeout(total=timeout)
        try:
            return _Reply(await session.request(method, path, **kw))
        except aiohttp.ClientConnectorError as exc:
            raise _NotConnected(type(exc).__name__) from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            raise _Dropped(f"{type(exc).__name__}: {exc}") from exc
        except TimeoutError as exc:
            raise _TimedOut() from exc
        except aiohttp.ClientError as exc:
            raise _Broken(f"{type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            if self._loop is asyncio.get_running_loop():
                await self._session.close()
        self._session = None


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
        # Only the new part of a cumulative chunk is converted: converting the whole list each time
        # costs O(n^2) over a long streamed completion.
        meta = chunk.get("meta_info") or {}
        reason, matched = _finish(meta)
        ids = chunk.get("output_ids") or []
        total = meta.get("completion_tokens")
        if total is not None and len(ids) == int(total) and len(ids) >= self.seen_ids:
            new_ids = [int(t) for t in ids[self.seen_ids:]]  # cumulative chunk
        elif reason == "abort":
            new_ids = []  # SGLang's abort chunk repeats the last token only: nothing new
        else:
            new_ids = [int(t) for t in ids]
        entries = meta.get("output_token_logprobs") or []
        # Same test for logprobs: a cumulative list is as long as the completion so far.
        new_lps = _logprobs({"output_token_logprobs": entries[self.seen_lps:] if total is not None
                             and len(entries) == int(total) else entries})
        if reason == "abort" and not new_ids:
            new_lps = []
        self.seen_ids += len(new_ids)
        self.seen_lps += len(new_lps)
        return GenerateDelta(new_ids, new_lps, reason, matched, meta if reason else {})


class EngineClient:
    """Async client of one engine at `base_url` (SGLang's native API)."""

    def __init__(self, base_url: str, *, timeout: float = 300, retries: int = 3, api_key: str | None = None,
                 keepalive_expiry: float = KEEPALIVE_EXPIRY_S) -> None:
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self.timeout = timeout
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._sender = _Sender(self.base_url, timeout, headers, keepalive_expiry)

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._sender.aclose()

    # -- plumbing ---------------------------------------------------------------------------

    def _timed_out(self, path: str) -> EngineTimeout:
        return EngineTimeout(f"engine at {self.base_url} did not answer {path} within {self.timeout:g}s")

    async def _send(self, method: str, path: str, *, json_body: Any = None, stream: bool = False,
                    headers: dict[str, str] | None = None) -> tuple[_Reply, bytes]:
        """Send with the retries above: the reply and, unless `stream`, its whole body (the caller
        closes a streamed reply)."""
        reply = await self._open(method, path, None if json_body is None else orjson.dumps(json_body), headers)
        if stream:
            return reply, b""
        try:
            return reply, await reply.read()
        except _TimedOut:
            raise self._timed_out(path) from None
        except _Broken as exc:
            raise EngineUnavailable(f"engine at {self.base_url} broke off {path}: {exc}") from None
        finally:
            await reply.close()

    async def _open(self, method: str, path: str, body: bytes | None, headers: dict[str, str] | None) -> _Reply:
        """The response's head (its body still to read). Retries stop here: once the engine has
        answered, it has the request, and sending it again could run it twice."""
        delay = 0.2
        redone = False
        attempt = 0
        while True:
            try:
                return await self._sender.send(method, path, body, None, headers)
            except _NotConnected as exc:
                if attempt == self.retries:
                    raise EngineUnavailable(
                        f"engine at {self.base_url} is down (cannot connect after {attempt + 1} tries: {exc})"
                    ) from None
                attempt += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
            except _TimedOut:
                raise self._timed_out(path) from None
            except _Dropped as exc:
                if redone:
                    raise EngineUnavailable(f"engine at {self.base_url} dropped {path}: {exc}") from None
                redone = True  # at once, on a fresh connection: the pool discards the dead one
            except _Broken as exc:
                raise EngineUnavailable(f"engine at {self.base_url} failed {path}: {exc}") from None

    def _check(self, status: int, body: bytes, path: str) -> None:
        if status >= 400:
            try:
                detail = _error_message(json.loads(body))
            except (json.JSONDecodeError, UnicodeDecodeError):
                detail = body.decode("utf-8", "replace").strip()[:300]
            message = f"engine at {self.base_url}: {path} -> HTTP {status}: {detail}"
            if status < 500:
                raise EngineRejected(message, status=status)
            raise EngineUnavailable(message)

    async def _call(self, method: str, path: str, json_body: Any = None,
                    headers: dict[str, str] | None = None) -> bytes:
        reply, body = await self._send(method, path, json_body=json_body, headers=headers)
        self._check(reply.status, body, path)
        return body

    def _json(self, body: bytes, path: str) -> Any:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            raise EngineUnavailable(f"engine at {self.base_url}: {path} answered non-JSON: {body[:200]!r}") from None

    @staticmethod
    def _routing(routing_key: str | None) -> dict[str, str] | None:
        return {ROUTING_KEY_HEADER: routing_key} if routing_key is not None else None

    @staticmethod
    def _generate_body(input_ids: list[int], sampling_params: dict[str, Any], lora_path: str | None,
                       rid: str | None, stream: bool, image_data: list[str] | None = None) -> dict[str, Any]:
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
        if image_data:  # SGLang's field: one data URL per image, in the order of their placeholder runs
            body["image_data"] = list(image_data)
        return body

    # -- generation -------------------------------------------------------------------------

    async def generate(self, input_ids: list[int], sampling_params: dict[str, Any], *,
                       lora_path: str | None = None, rid: str | None = None,
                       image_data: list[str] | None = None, routing_key: str | None = None) -> GenerateOutput:
        """One completion of `input_ids`; `lora_path` names a loaded adapter (None = base model).

        `image_data`: `data:image/...;base64,...` URLs, one per image placeholder run already
        expanded in `input_ids` (SGLang's /generate field; the engine recomputes pixel values).
        `routing_key`: calls with the same key stay on one worker behind a router (see the module doc)."""
        body = await self._call("POST", "/generate", self._generate_body(input_ids, sampling_params, lora_path, rid,
                                                                         False, image_data),
                                self._routing(routing_key))
        return parse_generate_response(self._json(body, "/generate"))

    async def stream_generate(self, input_ids: list[int], sampling_params: dict[str, Any], *,
                              lora_path: str | None = None, rid: str | None = None,
                              image_data: list[str] | None = None,
                              routing_key: str | None = None) -> AsyncIterator[GenerateDelta]:
        """Yield incremental `GenerateDelta`s; the last one carries `finish_reason`.

        A stream that ends without a finish reason (the engine died) raises EngineUnavailable."""
        reply, _ = await self._send("POST", "/generate", stream=True, headers=self._routing(routing_key),
                                    json_body=self._generate_body(input_ids, sampling_params, lora_path, rid, True,
                                                                  image_data))
        try:
            if reply.status >= 400:
                self._check(reply.status, await reply.read(), "/generate")
            tracker = _DeltaTracker()
            finished = False
            async for line in reply.lines():
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                chunk = orjson.loads(payload)
                if "error" in chunk:  # SGLang streams its validation errors (ValueError) this way
                    raise EngineRejected(f"engine at {self.base_url}: /generate stream failed: {_error_message(chunk)}")
                delta = tracker.delta(chunk)
                finished = delta.finish_reason is not None
                if delta.token_ids or finished:
                    yield delta
            if not finished:
                raise EngineUnavailable(f"engine at {self.base_url}: /generate stream ended before the completion "
                                        "finished")
        except orjson.JSONDecodeError as exc:
            raise EngineUnavailable(f"engine at {self.base_url}: bad stream chunk: {exc}") from None
        except _TimedOut:
            raise EngineTimeout(f"engine at {self.base_url}: /generate stream stalled for {self.timeout:g}s") from None
        except _Broken as exc:
            raise EngineUnavailable(f"engine at {self.base_url}: /generate stream broke: {exc}") from None
        finally:
            await reply.close()

    # -- control ----------------------------------------------------------------------------

    async def _admin(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        raw = await self._call("POST", path, body)
        try:
            out = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return {"success": True, "message": raw.decode("utf-8", "replace")}
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
        return self._json(await self._call("GET", "/model_info"), "/model_info")

    async def context_length(self) -> int | None:
        """The longest sequence (prompt + completion) the engine serves, as it reports it; None when
        it reports none. The embedded engine answers `context_length` on /model_info (from the model
        config); SGLang's /get_server_info has `context_length` (its server arg, may be null),
        `max_total_num_tokens` (the KV cache's size) and `max_req_input_len` (the longest prompt:
        min(the model's context, the KV cache) - 1); older versions only /get_model_info."""
        for path in ("/model_info", "/get_server_info", "/get_model_info"):
            try:
                info = orjson.loads(await self._call("GET", path))
            except (EngineRejected, orjson.JSONDecodeError):  # no such route here
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
            reply = await self._sender.send("GET", "/health", None, 5.0)
        except (_NotConnected, _Dropped, _TimedOut, _Broken):
            return False
        try:
            await reply.read()
        except (_TimedOut, _Broken):
            return False
        finally:
            await reply.close()
        return reply.status == 200

    async def wait_healthy(self, timeout: float) -> None:
        """Poll /health until it answers 200, or raise EngineError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            if await self.health():
                return
            if time.monotonic() >= deadline:
                raise EngineUnavailable(f"engine at {self.base_url} did not become healthy within {timeout:g}s")
            await asyncio.sleep(0.1)
