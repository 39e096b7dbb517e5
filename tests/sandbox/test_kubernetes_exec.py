"""The exec client against an endpoint that sends frames as the apiserver does (tests/k8s_double/frames.py,
in its own process): every byte of every channel comes out, in order, whatever the framing and timing;
large outputs are capped without the controller holding them. Runs `run_exec_stream`, the backend's
own exec path, over the client's `create_websocket`."""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time

import psutil
import pytest
from tests.k8s_double.frames import FrameEndpoint
from kubernetes.client import ApiClient, Configuration

from openforge.errors import SandboxError
from openforge.sandbox.k8s_exec import run_exec_stream

pytestmark = pytest.mark.timeout(120)


def api_client(url: str) -> ApiClient:
    cfg = Configuration()
    cfg.host, cfg.api_key, cfg.api_key_prefix = url, {"BearerToken": "t"}, {"BearerToken": "Bearer"}
    return ApiClient(cfg)


def run(url: str, *, limit: int | None = None, stdin: bytes | None = None, timeout: float = 60):  # type: ignore[no-untyped-def]
    return run_exec_stream(api_client(url), pod="p", namespace="ns", container="sandbox", argv=["sh", "-c", "x"],
                           timeout=timeout, stdin=stdin, limit=limit, stopped=threading.Event())


def interleaved(n: int, seed: int) -> tuple[list, bytes, bytes]:
    """n frames, 80% stdout, 1-48 bytes each, in bursts of 1-16 with a pause after each."""
    rng, frames, out, err = random.Random(seed), [], bytearray(), bytearray()
    burst = 0
    for _ in range(n):
        channel = 1 if rng.random() < 0.8 else 2
        chunk = rng.randbytes(rng.randint(1, 48))
        frames.append((channel, chunk))
        (out if channel == 1 else err).extend(chunk)
        burst += 1
        if burst >= rng.randint(1, 16):
            frames.append(None)
            burst = 0
    return frames, bytes(out), bytes(err)


@pytest.mark.slow
def test_100k_interleaved_frames_come_out_exactly() -> None:
    frames, out, err = interleaved(100_000, seed=21)
    with FrameEndpoint(lambda query: frames) as ep:
        raw = run(ep.url)
    assert (raw.exit_code, raw.truncated, raw.timed_out) == (0, False, False)
    assert len(raw.stdout) == len(out) and raw.stdout == out
    assert len(raw.stderr) == len(err) and raw.stderr == err


def test_large_output_exact_and_capped_without_holding_it() -> None:
    rng = random.Random(5)
    blob = rng.randbytes(32 << 20)
    frames = [(1, blob[i:i + 32 * 1024]) for i in range(0, len(blob), 32 * 1024)] + [(2, b"done\n")]
    with FrameEndpoint(lambda query: frames) as ep:
        t0 = time.monotonic()
        raw = run(ep.url)
        whole_s = time.monotonic() - t0
        assert hashlib.sha256(raw.stdout).digest() == hashlib.sha256(blob).digest() and raw.stderr == b"done\n"
        del raw
        rss0 = psutil.Process().memory_info().rss
        capped = run(ep.url, limit=1 << 20)
        grown = psutil.Process().memory_info().rss - rss0
    assert capped.truncated and capped.stdout == blob[:1 << 20] and capped.stderr == b"done\n"
    assert grown < 24 << 20, f"the capped read grew the controller by {grown >> 20} MiB"
    assert whole_s < 30  # 32 MiB through the loop: linear, not the client's quadratic bytes +=


def test_status_stdin_and_the_v5_close_signal() -> None:
    failure = json.dumps({"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
                          "message": "command terminated with non-zero exit code: exit code 3",
                          "details": {"causes": [{"reason": "ExitCode", "message": "3"}]}}).encode()
    with FrameEndpoint(lambda query: [(1, b"out"), (2, b"err")], status=failure) as ep:
        raw = run(ep.url, stdin=b"x" * 70_000)
        sent = [ep.next_received() for _ in range(3)]
    assert (raw.exit_code, raw.stdout, raw.stderr) == (3, b"out", b"err")
    assert sent[0] == b"\x00" + b"x" * 65536 and sent[1] == b"\x00" + b"x" * (70_000 - 65536)
    assert sent[2] == b"\xff\x00"  # v5: stdin closed, so the command sees EOF
    with FrameEndpoint(lambda query: [(1, b"x")], protocols=("v4.channel.k8s.io",)) as ep:
        run(ep.url, stdin=b"abc")
        assert ep.next_received() == b"\x00abc"
        with pytest.raises(Exception):
            ep.next_received(timeout=0.5)  # v4 has no CLOSE signal: none is sent


def test_a_stream_that_ends_without_a_status_is_an_error() -> None:
    with FrameEndpoint(lambda query: [(1, b"partial")], status=b"") as ep:
        with pytest.raises(SandboxError, match="no exit status|unreadable status"):
            run(ep.url)


def test_a_throttled_exec_upgrade_is_retried_after_retry_after() -> None:
    from aiohttp import web

    class Throttled(FrameEndpoint):
        async def _exec(self, request: web.Request):  # type: ignore[no-untyped-def]
            self.count = getattr(self, "count", 0) + 1
            if self.count == 1:  # the apiserver's max-in-flight limit: 429, try again in a second
                return web.json_response({"kind": "Status", "status": "Failure", "code": 429,
                                          "reason": "TooManyRequests", "message": "too many requests"},
                                         status=429, headers={"Retry-After": "1"})
            return await super()._exec(request)

    with Throttled(lambda query: [(1, b"ok")]) as ep:
        t0 = time.monotonic()
        raw = run(ep.url)
    assert raw.stdout == b"ok" and raw.exit_code == 0 and time.monotonic() - t0 >= 1.0
