"""Fault tests: kills, dying engines and hostile agents lose nothing and leave nothing behind.

Everything here is real: the proxy in its own process (killed with SIGKILL), the embedded engine as a
supervised child (killed mid-stream), the local sandbox backend running shell agents that hang,
fork-bomb, fill the disk or print 100 MB. All traffic stays on 127.0.0.1 and every loop is bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from openforge.engine.scripted import ScriptedEngine
from openforge.engine.serve import serve_in_thread
from openforge.config import EmbeddedEngineConfig, ForgeConfig, ProxyConfig
from openforge.store import Store
from openforge.proxy.server import ProxyServer
from openforge.rollouts.runner.trajectory import assemble_rollout
from openforge.rollouts.harnesses.base import HarnessBase, HarnessContext, HarnessOutcome
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import TaskSpec
from openforge.sandbox.base import ExecResult, Sandbox
from openforge.sandbox.local import SANDBOX_ENV
from openforge.sandbox.procs import marked_pids

pytestmark = pytest.mark.timeout(240)

_PROXY_MAIN = textwrap.dedent("""
    import sys, time
    from openforge.config import ProxyConfig
    from openforge.proxy.server import ProxyServer
    server = ProxyServer(ProxyConfig(max_concurrent_calls=128), store_path=sys.argv[1], engine_url=sys.argv[2],
                         model_path=sys.argv[3]).start()
    print(server.url, flush=True)
    while True:
        time.sleep(60)
""")


def _chat(url: str, key: str, text: str) -> dict:
    return {"url": f"{url}/v1/chat/completions", "headers": {"Authorization": f"Bearer {key}"},
            "json": {"model": "forge-policy", "messages": [{"role": "user", "content": text}], "max_tokens": 16}}


def _wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def test_proxy_killed_with_50_calls_in_flight_loses_no_answered_call(tiny_model: Path, store: Store) -> None:
    engine = ScriptedEngine(tiny_model, lambda ids: "hello world, the answer is 42")
    run = store.create_run(kind="proxy")
    store.set_run_status(run.id, "running")
    rollouts = [store.create_rollout(run_id=run.id, task_id=f"t{i}", status="running") for i in range(5)]
    with serve_in_thread(engine.app) as eng:
        proc = subprocess.Popen([sys.executable, "-c", _PROXY_MAIN, str(store.path), eng.url, str(tiny_model)],
                                stdout=subprocess.PIPE, text=True)
        try:
            url = proc.stdout.readline().strip()
            assert url.startswith("http://127.0.0.1:")
            async with httpx.AsyncClient(timeout=30) as client:
                # 10 calls that are answered before the kill...
                answered = await asyncio.gather(*(client.post(**_chat(url, rollouts[i % 5].key, f"q{i}"))
                                                  for i in range(10)))
                assert [r.status_code for r in answered] == [200] * 10
                # ...then 50 the engine holds on to while the proxy is killed.
                for _ in range(50):
                    engine.fail_next("delay", seconds=120)
                pending = [asyncio.create_task(client.post(**_chat(url, rollouts[i % 5].key, f"late{i}")))
                           for i in range(50)]
                await asyncio.to_thread(_wait_for, lambda: len(engine.requests) >= 60, 60, "50 calls at the engine")
                await asyncio.to_thread(
                    _wait_for, lambda: len(store.list_calls(run_id=run.id)) >= 60, 30, "50 in-flight rows")
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
                outcomes = await asyncio.gather(*pending, return_exceptions=True)
                assert all(isinstance(o, httpx.TransportError) for o in outcomes)  # refused, not hung
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

        assert store.integrity_check() == "ok"
        calls = store.list_calls(run_id=run.id)
        ok = [c for c in calls if c.status == "ok"]
        assert len(ok) == 10 and all(c.completion_ids and c.response_json for c in ok)
        assert sum(c.status == "in_flight" for c in calls) == 50

        # Restart: the stale calls are marked, and the same rollouts go on recording.
        server = ProxyServer(ProxyConfig(), store_path=store.path, engine_url=eng.url, model_path=tiny_model).start()
        try:
            assert server.interrupted_on_start == 50
            async with httpx.AsyncClient(timeout=30) as client:
                again = await client.post(**_chat(server.url, rollouts[0].key, "after restart"))
            assert again.status_code == 200
        finally:
            server.stop()
    calls = store.list_calls(run_id=run.id)
    assert sum(c.status == "interrupted" for c in calls) == 50
    assert sum(c.status == "ok" for c in calls) == 11
    stats = assemble_rollout(store, rollouts[0].id)
    segments = store.list_trajectories(rollout_ids=[rollouts[0].id])
    recorded = [c for c in calls if c.rollout_id == rollouts[0].id and c.status == "ok"]
    sampled = sum(sum(t.loss_mask) for t in segments)
    assert sampled == sum(len(c.completion_ids) for c in recorded)  # only answered calls train
    assert stats["n_calls"] == len(recorded)


def test_engine_killed_mid_stream_gives_an_api_error_then_recovers(tiny_model: Path, store: Store, forge_home: Path) -> None:
    from openai import APIError, OpenAI

    from openforge.engine.supervisor import EngineProcess

    config = EmbeddedEngineConfig(model=str(tiny_model), startup_timeout_s=120)
    engine = EngineProcess(config, model_path=str(tiny_model), log_path=forge_home / "engine.log")
    engine.start()
    run = store.create_run(kind="proxy")
    ro = store.create_rollout(run_id=run.id, task_id="t", status="running")
    server = ProxyServer(ProxyConfig(call_timeout_s=60), store_path=store.path, engine_url=engine.url,
                         model_path=tiny_model).start()
    try:
        client = OpenAI(base_url=server.url + "/v1", api_key=ro.key, max_retries=0, timeout=60)
        first_pid = engine.pid
        started = time.monotonic()
        # A long sampled stream (the random tiny model rarely stops early); kill the engine after the first chunk.
        stream = client.chat.completions.create(model="forge-policy", stream=True, max_tokens=4000,
                                                temperature=1.0, messages=[{"role": "user", "content": "go"}])
        failure: Exception | None = None
        n_chunks = 0
        try:
            for _chunk in stream:
                n_chunks += 1
                if n_chunks == 1:
                    os.kill(first_pid, signal.SIGKILL)
        except APIError as exc:  # the stream's own error event, raised by the SDK
            failure = exc
        assert n_chunks >= 1 and time.monotonic() - started < 60
        assert failure is not None, "a stream cut by a dead engine must end in an API error, not a clean finish"
        _wait_for(lambda: engine.pid not in (None, first_pid) and engine.restarts >= 1, 120, "engine restart")
        # The restarted engine serves later calls.
        deadline = time.monotonic() + 120
        while True:
            try:
                reply = client.chat.completions.create(model="forge-policy", max_tokens=8,
                                                       messages=[{"role": "user", "content": "again"}])
                break
            except APIError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        assert reply.choices[0].finish_reason in ("stop", "length")
    finally:
        server.stop()
        engine.stop()
    calls = store.list_calls(rollout_id=ro.id)
    assert calls[0].status == "error" and calls[-1].status == "ok"
    assert not psutil.pid_exists(first_pid) or psutil.Process(first_pid).status() == psutil.STATUS_ZOMBIE


class _ShellHarness(HarnessBase):
    """A real adapter whose agent is one shell line (a test's hostile or flaky 'agent'). The line
    stands for what an agent does, so its crash is the agent's: this harness itself never fails."""

    name = "shell"
    calls_model = False

    def __init__(self, script: str | None = None) -> None:
        self.script = script

    async def prepare(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
        return None

    def command(self, ctx: HarnessContext) -> list[str]:
        return ["sh", "-c", self.script or ctx.instruction]

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {"OPENAI_API_KEY": ctx.api_key}

    async def outcome(self, result: ExecResult, sandbox: Sandbox) -> HarnessOutcome:
        return HarnessOutcome(answer="")


def _leftovers(forge_home: Path, rollout_ids: list[str]) -> tuple[list[str], list[int]]:
    root = forge_home / "sandboxes"
    dirs = sorted(p.name for p in root.iterdir()) if root.exists() else []
    pids = [pid for rid in rollout_ids for pid in marked_pids(SANDBOX_ENV, rid)]
    return dirs, pids


async def test_hostile_agents_are_stopped_at_their_limits_and_the_run_goes_on(store: Store, forge_home: Path) -> None:
    hostile = {
        "hang": "sleep 600",
        "forkbomb": "bomb() { bomb | bomb & }; bomb; sleep 600",
        "diskfill": "dd if=/dev/zero of=big bs=1M count=100000",
        "printer": "head -c 100000000 /dev/zero | tr '\\0' x",
        "good": "echo done > done.txt",
    }
    cfg = ForgeConfig()
    cfg.runner.concurrency = 5
    cfg.runner.verifier_timeout_s = 10
    cfg.sandbox.max_processes = 64
    cfg.sandbox.max_file_mb = 16
    tasks = [TaskSpec(id=name, instruction=script, verifier="test -f done.txt", time_limit_s=8)
             for name, script in hostile.items()]
    runner = RolloutRunner(store, config=cfg, proxy_url="http://127.0.0.1:9", harness=_ShellHarness())
    run = store.create_run()
    started = time.monotonic()
    rollouts = await runner.run(run.id, [RolloutSpec(t, 0) for t in tasks])
    elapsed = time.monotonic() - started
    by_task = {r.task_id: store.get_rollout(r.id) for r in rollouts}
    assert by_task["good"].status == "scored" and by_task["good"].reward == 1.0
    assert by_task["hang"].status == "timed_out"
    # A fork bomb either runs into the time limit or, once the process limit stops even `sleep` from
    # forking, exits on its own: contained either way, and worth nothing.
    for name in ("forkbomb", "diskfill", "printer"):
        assert by_task[name].status in ("scored", "timed_out") and not by_task[name].reward
    assert len(by_task["printer"].stdout or "") < 1_000_000  # kept output is capped, not 100 MB
    assert elapsed < 60
    dirs, pids = _leftovers(forge_home, [r.id for r in rollouts])
    assert dirs == [] and pids == []


async def test_200_rollouts_with_random_kills_leave_nothing_behind(store: Store, forge_home: Path) -> None:
    rng = random.Random(7)
    cfg = ForgeConfig()
    cfg.runner.concurrency = 8
    cfg.runner.verifier_timeout_s = 10
    cfg.sandbox.start_retries = 0
    tasks = [TaskSpec(id=f"t{i}", instruction=f"sleep 0.{rng.randrange(1, 4)}; echo ok > done.txt",
                      verifier="test -f done.txt", time_limit_s=5) for i in range(20)]
    specs = [RolloutSpec(tasks[i % 20], i // 20) for i in range(200)]
    runner = RolloutRunner(store, config=cfg, proxy_url="http://127.0.0.1:9", harness=_ShellHarness())
    run = store.create_run()
    killed = 0

    async def killer() -> None:
        nonlocal killed
        me = psutil.Process()
        while True:
            await asyncio.sleep(rng.uniform(0.02, 0.15))
            victims = [p for p in me.children(recursive=True) if _is_agent(p)]
            if victims:
                try:
                    rng.choice(victims).kill()
                    killed += 1
                except psutil.Error:
                    pass

    chaos = asyncio.create_task(killer())
    try:
        rollouts = await asyncio.wait_for(runner.run(run.id, specs), timeout=200)
    finally:
        chaos.cancel()
    final = [store.get_rollout(r.id) for r in rollouts]
    assert len(final) == 200
    assert all(r.status in ("scored", "failed", "timed_out") for r in final)
    assert killed >= 5, "the chaos task must really have killed agents"
    assert sum(r.reward == 1.0 for r in final) >= 100  # most survive; killed ones are data, not crashes
    dirs, pids = _leftovers(forge_home, [r.id for r in final])
    assert dirs == [] and pids == []


def _is_agent(proc: psutil.Process) -> bool:
    try:
        return proc.name() == "sleep"
    except psutil.Error:
        return False


def _task_records():  # type: ignore[no-untyped-def]
    scalar = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True), st.text(max_size=20))
    value = st.recursive(scalar, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                         max_leaves=6)
    keys = st.sampled_from(["id", "instruction", "verifier", "time_limit_s", "setup", "setup_files", "files",
                            "difficulty", "tags", "extra"])
    record = st.dictionaries(keys, value, max_size=6)
    line = st.one_of(record.map(json.dumps), st.text(max_size=40), st.binary(max_size=40).map(lambda b: b.decode("latin-1")))
    return st.lists(line, max_size=6)


def test_fuzzed_task_files_are_reported_never_crash(tmp_path_factory: pytest.TempPathFactory) -> None:
    from openforge.errors import TaskError
    from openforge.rollouts.tasks.format import load_tasks, validate_tasks

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(lines=_task_records())
    def check(lines: list[str]) -> None:
        path = tmp_path_factory.mktemp("fuzz") / "tasks.jsonl"
        path.write_text("\n".join(lines), encoding="utf-8", errors="surrogateescape")
        problems = validate_tasks(path)
        assert all(p.message for p in problems)
        try:
            tasks = load_tasks(path)
        except TaskError as exc:
            assert problems and str(exc)  # refused with the reasons validate reported
        else:
            assert not problems and all(t.id and t.verifier for t in tasks)

    check()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/v1/messages",
                                  "/v1/messages/count_tokens"])
def test_oversize_bodies_are_refused_on_every_endpoint(tiny_model: Path, store: Store, path: str) -> None:
    engine = ScriptedEngine(tiny_model, lambda ids: "ok")
    run = store.create_run(kind="proxy")
    ro = store.create_rollout(run_id=run.id, task_id="t", status="running")
    with serve_in_thread(engine.app) as eng:
        server = ProxyServer(ProxyConfig(max_body_bytes=64 * 1024), store_path=store.path, engine_url=eng.url,
                             model_path=tiny_model).start()
        try:
            body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x" * 200_000}],
                    "input": "x" * 200_000}
            resp = httpx.post(server.url + path, json=body, headers={"x-api-key": ro.key,
                                                                    "authorization": f"Bearer {ro.key}"},
                              timeout=30)
        finally:
            server.stop()
    assert resp.status_code == 413
    err = resp.json()
    assert isinstance((err.get("error") or {}).get("message"), str)
    assert engine.requests == []  # refused before any work reached the engine


_SUPERVISOR_MAIN = textwrap.dedent("""
    import sys, time
    from openforge.config import EmbeddedEngineConfig
    from openforge.engine.supervisor import EngineProcess
    engine = EngineProcess(EmbeddedEngineConfig(model=sys.argv[1], startup_timeout_s=120), model_path=sys.argv[1],
                           log_path=sys.argv[2])
    engine.start()
    print(engine.pid, flush=True)
    time.sleep(600)
""")


def test_a_sigkilled_supervisor_leaves_no_engine_behind(tiny_model: Path, forge_home: Path) -> None:
    # SIGKILL runs no cleanup in the supervising process; the engine notices its parent is gone.
    proc = subprocess.Popen([sys.executable, "-c", _SUPERVISOR_MAIN, str(tiny_model), str(forge_home / "e.log")],
                            stdout=subprocess.PIPE, text=True)
    try:
        engine_pid = int(proc.stdout.readline())
        assert psutil.pid_exists(engine_pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        _wait_for(lambda: not psutil.pid_exists(engine_pid)
                  or psutil.Process(engine_pid).status() == psutil.STATUS_ZOMBIE, 30, "the orphaned engine to exit")
    finally:
        if proc.poll() is None:
            proc.kill()


# ---------------------------------------------------------------------------------------------
# A full disk: SIGTERM still ends a run cleanly, and says why.


@pytest.fixture
def full_disk(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A tiny tmpfs (8 MiB) to put FORGE_HOME on; `fill()` takes every byte left. Needs root and mount."""
    mnt = tmp_path / "tiny-fs"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("a full disk needs a tiny filesystem of its own: mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (a full disk needs one): {done.stderr.strip()}")

    def fill() -> None:
        with open(mnt / "filler", "wb", buffering=0) as fh:
            for chunk in (65536, 4096, 512, 1):  # down to the last byte
                try:
                    while True:
                        fh.write(b"\0" * chunk)
                except OSError as exc:
                    assert exc.errno == 28, exc  # ENOSPC

    try:
        yield mnt, fill
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _integrity(db: Path) -> str:
    import sqlite3

    conn = sqlite3.connect(db)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


def test_sigterm_on_a_full_disk_stops_forge_proxy_cleanly(tiny_model: Path, full_disk) -> None:  # type: ignore[no-untyped-def]
    """`forge proxy` with FORGE_HOME on a filesystem that fills up mid-session: a call it cannot record
    is a clear 500, SIGTERM ends it with one error line and exit code 1 (no traceback), the store is
    intact and the run is `stopped`, its error naming the full disk (the store's reserve paid for that)."""
    mnt, fill = full_disk
    home = mnt / "home"
    engine = ScriptedEngine(tiny_model, ["hello"] * 8)
    forge = [sys.executable, "-c", "from forge_cli.main import main; main()"]
    with serve_in_thread(engine.app) as es:
        proc = subprocess.Popen([*forge, "proxy", "--model", str(tiny_model), "--engine", es.url, "--api-key", "sk-disk"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "FORGE_HOME": str(home)})
        try:
            lines: list[str] = []
            deadline = time.monotonic() + 90
            while not (lines and lines[-1].startswith("api key")) and time.monotonic() < deadline:
                line = proc.stdout.readline()  # type: ignore[union-attr]
                if not line:
                    break
                lines.append(line.rstrip("\n"))
            assert lines and lines[-1] == "api key sk-disk", (lines, proc.poll())
            run_id, url = lines[0].split()[1], lines[1].split()[1]
            with httpx.Client(timeout=30) as client:
                assert client.post(**_chat(url, "sk-disk", "hi")).status_code == 200
                fill()
                for i in range(10):  # the first call that needs a new page of the store's WAL is refused
                    refused = client.post(**_chat(url, "sk-disk", f"hi again {i}"))
                    if refused.status_code != 200:
                        break
                assert refused.status_code == 500 and "no space left" in refused.text, refused.text
        finally:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err
    assert proc.returncode == 1, (proc.returncode, out, err)
    assert "forge: error: no space left for the run store" in err and "marked stopped" in err, err
    (mnt / "filler").unlink()
    assert _integrity(home / "forge.db") == "ok"
    store = Store(home / "forge.db")
    try:
        run = store.get_run(run_id)
        assert run.status == "stopped" and "no space left" in (run.error or ""), (run.status, run.error)
        (rollout,) = store.list_rollouts(run_id)
        assert rollout.status == "cancelled"
        calls = [c.status for c in store.list_calls(run_id=run_id)]
        assert calls == ["ok"] * len(calls) and len(calls) == i + 1  # the refused call left no row
    finally:
        store.close()


def test_a_run_ending_on_a_full_disk_still_records_its_end(full_disk) -> None:  # type: ignore[no-untyped-def]
    """The lifecycle's last write (runs/train.py) on a full disk: the reserve is spent on it, it never
    raises, and the run is `failed` with the disk's reason."""
    from openforge import reserve
    from openforge.runs.train import Outcome, _record_end

    mnt, fill = full_disk
    store = Store(mnt / "forge.db")
    try:
        run = store.create_run(kind="train", name="disk", owner_pid=os.getpid(), config={})
        store.set_run_status(run.id, "running")
        assert reserve.hold(store.path)
        fill()
        with pytest.raises(Exception, match="no space left"):  # the disk really is full for the store
            for i in range(50):
                store.create_rollout(run_id=run.id, task_id=f"t{i}", key=f"sk-{i}" * 20, status="running")
        outcome = Outcome(status="failed", error="no space left for the run store")
        _record_end(store, run.id, outcome)
        assert outcome.status == "failed"
        assert store.get_run(run.id).status == "failed" and "no space left" in (store.get_run(run.id).error or "")
        assert not reserve.reserve_path(store.path).exists()  # spent
    finally:
        store.close()
    assert _integrity(mnt / "forge.db") == "ok"
