"""runs.Stack (engine + proxy + runner + the trainer's engine client, up and down as one) and the
sampler's cancel token, on the real embedded engine and the real proxy on loopback."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from openforge.config import load_config
from openforge.errors import EngineError, ForgeError
from openforge.store import Store
from openforge.runs.stack import Stack, free_port
from openforge.trainer.bridge import BackgroundLoop
from openforge.trainer.cancel import CancelToken


@pytest.mark.slow
def test_the_stack_comes_up_and_goes_down_as_one(store: Store, tiny_model: Path, tmp_path: Path) -> None:
    config = load_config(None, overrides={"engine": {"model": str(tiny_model)}})
    with Stack(config, store, log_dir=tmp_path / "run", runner=True, client=True) as stack:
        engine_pid = stack.engine.pid
        assert psutil.pid_exists(engine_pid)
        assert httpx.get(f"{stack.proxy_url}/health", timeout=10).status_code == 200
        assert stack.bridge is not None and stack.bridge.run(stack.client.health())
        assert stack.runner.proxy_url == stack.proxy_url
        assert (tmp_path / "run" / "engine.log").is_file()
        # The engine holds a key of this run; without it, nothing but its health answers.
        assert len(stack.engine_key) >= 32
        refused = httpx.post(f"{stack.engine.url}/generate", json={"input_ids": [1], "sampling_params": {}}, timeout=10)
        assert refused.status_code == 401
        # The proxy answers on its unix socket too: what a sandbox without a network is given.
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(stack.proxy_socket))) as over_uds:
            assert over_uds.get("http://proxy/health", timeout=10).status_code == 200
        socket_dir = stack.proxy_socket.parent
        proxy_url = stack.proxy_url
    proc = psutil.Process(engine_pid) if psutil.pid_exists(engine_pid) else None
    assert proc is None or proc.status() == psutil.STATUS_ZOMBIE
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{proxy_url}/health", timeout=5)
    assert not socket_dir.exists()
    stack.stop()  # a second stop has nothing left to do


def test_a_failed_start_stops_what_had_started(store: Store, tiny_model: Path) -> None:
    dead = f"http://127.0.0.1:{free_port('127.0.0.1')}"  # nothing listens there
    config = load_config(None, overrides={"engine": {"kind": "url", "url": dead, "model": str(tiny_model),
                                                     "startup_timeout_s": 1.0}})
    stack = Stack(config, store, runner=True, client=True)
    with pytest.raises(EngineError):
        stack.start()
    assert stack.proxy is not None  # it started beside the engine ...
    with pytest.raises(ForgeError, match="the proxy is not running"):
        stack.proxy_url  # ... and is stopped again
    assert stack.bridge is None and stack.runner is None


def test_the_cancel_token_ends_the_step_in_flight_and_every_later_one() -> None:
    token, bridge = CancelToken(), BackgroundLoop()
    cleaned = threading.Event()

    async def step() -> str:
        try:
            await asyncio.sleep(60)
            return "finished"
        finally:
            cleaned.set()  # the runner's own cleanup (sandbox stop) runs before the caller hears

    try:
        future = bridge.submit(token.guard(step()))
        time.sleep(0.2)
        assert not future.done()
        threading.Thread(target=token.cancel).start()
        with pytest.raises(concurrent.futures.CancelledError):
            future.result(timeout=10)
        assert cleaned.is_set() and token.cancelled
        cleaned.clear()
        with pytest.raises(concurrent.futures.CancelledError):  # a step asked for after the stop never starts
            bridge.run(token.guard(step()))
        assert not cleaned.is_set()
        with pytest.raises(KeyboardInterrupt):  # what the trainer records as `stopped`
            token.check()
    finally:
        bridge.close()
