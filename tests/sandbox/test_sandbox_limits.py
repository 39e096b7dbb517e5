"""Resource limits hold against hostile commands: fork bomb, disk filler, 100 MB printer, memory hog,
CPU spinner. Each is bounded by a small limit and a short timeout, so the suite stays fast."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import psutil
import pytest

from openforge.config import DockerSandboxConfig, SandboxConfig
from openforge.sandbox import make_sandbox
from openforge.sandbox.testing import backend_config
from tests.helpers.required import skip_or_fail

pytestmark = pytest.mark.timeout(90)
BACKENDS = ["local-bwrap", "local-plain", "docker"]
FORK_BOMB = "bomb() { bomb | bomb & }; bomb; sleep 5"


def _config(name: str, **local: object) -> SandboxConfig:
    cfg, why = backend_config(name, **local)
    if cfg is None:
        skip_or_fail(name, why)  # only "docker" can be required (CI installs it)
    if isinstance(cfg, DockerSandboxConfig) and "max_processes" in local:
        cfg.pids_limit = int(local["max_processes"])  # type: ignore[call-overload]
    return cfg


def _sandbox(cfg: SandboxConfig, name: str):
    return make_sandbox(cfg, run_id="run-limits", rollout_id=f"ro-{name}-{os.getpid()}")


async def _count_sandbox_processes(sb) -> int:  # type: ignore[no-untyped-def]
    if sb.info.backend == "local":
        n = 0
        for proc in psutil.process_iter():
            try:
                n += proc.environ().get("OPENFORGE_SANDBOX") == sb.info.sandbox_id
            except psutil.Error:
                continue
        return n
    import docker

    client = docker.DockerClient(base_url=os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock")
    try:
        return len(client.api.top(sb._container.id)["Processes"] or [])
    finally:
        client.close()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_fork_bomb_is_contained_and_cleaned_up(backend: str) -> None:
    limit = 40
    async with _sandbox(_config(backend, max_processes=limit), f"bomb-{backend}") as sb:
        run = asyncio.ensure_future(sb.exec(FORK_BOMB, timeout=2))
        peak = 0
        while not run.done():
            peak = max(peak, await _count_sandbox_processes(sb))
            await asyncio.sleep(0.1)
        res = run.result()
        # The bomb hit the process limit (the shells say they cannot fork); it then ran into the
        # deadline or its parent gave up (busybox quits at once). Never past the limit meanwhile.
        assert "fork" in res.stderr.lower()
        assert peak <= limit + 2  # +2: docker-init and the container's idle process
        await asyncio.sleep(0.2)
        # Everything the bomb made is gone; the sandbox still works for the next command.
        assert (await sb.exec("echo alive", timeout=10)).stdout == "alive\n"
        expected = 0 if sb.info.backend == "local" else 2
        assert await _count_sandbox_processes(sb) <= expected


@pytest.mark.parametrize("backend", ["local-bwrap", "local-plain"])
async def test_disk_filler_is_stopped_by_the_file_size_limit(backend: str) -> None:
    async with _sandbox(_config(backend, max_file_mb=2), f"disk-{backend}") as sb:
        res = await sb.exec("head -c 50000000 /dev/zero > big.bin", timeout=20)
        assert res.exit_code != 0
        size = os.path.getsize(sb.dir / "work" / "big.bin")
        assert size <= 2 << 20


@pytest.mark.parametrize("backend", BACKENDS)
async def test_100mb_printer_is_truncated_without_blocking_or_buffering(backend: str) -> None:
    async with _sandbox(_config(backend), f"print-{backend}") as sb:
        rss_before = psutil.Process().memory_info().rss
        t0 = time.monotonic()
        res = await sb.exec("head -c 100000000 /dev/zero | tr '\\0' x; echo done >&2", timeout=60,
                            max_output=64 * 1024)
        elapsed = time.monotonic() - t0
        assert res.exit_code == 0 and not res.timed_out and res.stderr == "done\n"
        assert res.truncated and len(res.stdout) == 64 * 1024 and set(res.stdout) == {"x"}
        assert psutil.Process().memory_info().rss - rss_before < 50 << 20  # never held 100 MB
        assert elapsed < 45


@pytest.mark.parametrize("backend", ["local-bwrap", "local-plain"])
async def test_memory_hog_fails_under_the_memory_limit(backend: str) -> None:
    async with _sandbox(_config(backend, memory_mb=200), f"mem-{backend}") as sb:
        ok = await sb.exec([sys.executable, "-c", "b = bytearray(20 << 20); print('small ok')"], timeout=30)
        assert ok.exit_code == 0, ok.stderr
        hog = await sb.exec([sys.executable, "-c", "b = bytearray(1 << 30); print('allocated')"], timeout=30)
        assert hog.exit_code != 0 and "allocated" not in hog.stdout


@pytest.mark.parametrize("backend", ["local-bwrap"])
async def test_cpu_spinner_is_killed_by_the_cpu_time_limit(backend: str) -> None:
    async with _sandbox(_config(backend, cpu_time_s=1), f"cpu-{backend}") as sb:
        res = await sb.exec("while :; do :; done", timeout=20)
        assert not res.timed_out and res.exit_code == 128 + 24  # SIGXCPU, long before the timeout


async def test_limits_hold_on_the_preexec_path_when_prlimit_is_missing(monkeypatch) -> None:
    import shutil as real_shutil

    from openforge.sandbox import procs as sandbox_procs

    which = real_shutil.which
    monkeypatch.setattr(sandbox_procs.shutil, "which", lambda name: None if name == "prlimit" else which(name))
    async with _sandbox(_config("local-plain", max_file_mb=1), "noprlimit") as sb:
        res = await sb.exec("ulimit -f; head -c 5000000 /dev/zero > big.bin", timeout=20)
        assert res.exit_code != 0 and res.stdout.strip() == str((1 << 20) // 512)  # dash counts 512-byte blocks
        assert os.path.getsize(sb.dir / "work" / "big.bin") <= 1 << 20
