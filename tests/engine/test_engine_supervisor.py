"""EngineProcess with the real embedded engine as its child: start, kill -9, restart, stop."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

from openforge.engine.scripted import ScriptedEngine
from openforge.engine.serve import serve_in_thread
from openforge.engine.sglang import sglang_command
from openforge.engine.supervisor import EngineProcess, engine_api_key, make_engine_url
from openforge.config import EmbeddedEngineConfig, SglangEngineConfig, UrlEngineConfig
from openforge.errors import EngineError


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _greedy(url: str, key: str) -> list[int]:
    body = {"input_ids": [5, 6, 7], "sampling_params": {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}}
    resp = httpx.post(url + "/generate", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    return resp.raise_for_status().json()["output_ids"]


def _argv_and_env(pid: int) -> tuple[bytes, bytes]:
    return Path(f"/proc/{pid}/cmdline").read_bytes(), Path(f"/proc/{pid}/environ").read_bytes()


@pytest.mark.slow
def test_child_is_restarted_after_kill_9_and_stopped_with_its_group(tiny_model, tmp_path):
    key = engine_api_key(EmbeddedEngineConfig())
    engine = EngineProcess(EmbeddedEngineConfig(model=str(tiny_model), startup_timeout_s=120),
                           log_path=tmp_path / "engine.log", max_restarts=2, api_key=key)
    restarted = []
    engine.on_restart.append(lambda: restarted.append(engine.pid))
    engine.start()
    try:
        first_pid = engine.pid
        argv, env = _argv_and_env(first_pid)
        # The key reached the child through its environment (/proc/PID/environ is readable by its
        # owner only), never argv (/proc/PID/cmdline is readable by every local user).
        assert key.encode() not in argv and f"FORGE_ENGINE_API_KEY={key}".encode() in env
        assert httpx.post(engine.url + "/generate", json={"input_ids": [5]}).status_code == 401
        before = _greedy(engine.url, key)
        os.kill(first_pid, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while not restarted and time.monotonic() < deadline:
            time.sleep(0.1)
        assert engine.restarts == 1 and restarted == [engine.pid] and engine.pid != first_pid
        assert _greedy(engine.url, key) == before  # same port, same model, same key, same answer
    finally:
        engine.stop()
    assert _gone(restarted[0]) and engine.pid is None
    assert "==> " in (tmp_path / "engine.log").read_text() and key not in (tmp_path / "engine.log").read_text()


def test_a_child_that_cannot_start_reports_its_log(tmp_path):
    engine = EngineProcess(EmbeddedEngineConfig(model=str(tmp_path / "nope"), startup_timeout_s=60),
                           log_path=tmp_path / "e.log")
    with pytest.raises(EngineError, match="exited with code 1 before it became healthy.*does not exist"):
        engine.start()


def test_sglang_launch_failure_is_clear(tmp_path, tiny_model):
    # This venv has no sglang: the launcher's real failure path, with its real error in the message.
    config = SglangEngineConfig(sglang_python=sys.executable, startup_timeout_s=60)
    engine = EngineProcess(config, model_path=str(tiny_model), log_path=tmp_path / "s.log")
    with pytest.raises(EngineError, match="sglang engine exited with code 1.*No module named 'sglang'"):
        engine.start()


def test_sglang_command_line():
    config = SglangEngineConfig(sglang_python="/opt/sgl/bin/python", tp_size=2, max_lora_rank=16,
                                dtype="bfloat16", seed=3, sglang_args=["--mem-fraction-static", "0.7"])
    cmd = sglang_command(config, model_path="/models/qwen", port=30001, lora_target_modules=["q_proj", "v_proj"])
    assert cmd == ["/opt/sgl/bin/python", "-m", "sglang.launch_server", "--model-path", "/models/qwen",
                   "--host", "127.0.0.1", "--port", "30001", "--tp-size", "2", "--random-seed", "3",
                   "--incremental-streaming-output", "--enable-lora",
                   "--max-lora-rank", "16", "--lora-target-modules", "q_proj", "v_proj", "--dtype", "bfloat16",
                   "--mem-fraction-static", "0.7"]


def test_kind_url_waits_for_the_running_engine(tiny_model):
    with pytest.raises(EngineError, match="needs engine.url"):
        make_engine_url(UrlEngineConfig())
    with pytest.raises(EngineError, match="must start with http"):
        make_engine_url(UrlEngineConfig(url="gpu:30000"))
    with serve_in_thread(ScriptedEngine(tiny_model, ["x"]).app) as server:
        engine = EngineProcess(UrlEngineConfig(url=server.url + "/", startup_timeout_s=5))
        engine.start()
        assert engine.url == server.url and engine.pid is None
        engine.stop()
    with pytest.raises(EngineError, match="did not become healthy within 0.5s"):
        EngineProcess(UrlEngineConfig(url=server.url, startup_timeout_s=0.5)).start()
