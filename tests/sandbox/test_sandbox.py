"""Interface conformance: the same checks on every backend that runs here (local with bubblewrap,
local plain, docker); a backend that cannot run is skipped with the reason."""

from __future__ import annotations

import asyncio
import gc
import os

import psutil
import pytest

from openforge.config import SandboxConfig
from openforge.errors import SandboxError
from openforge.sandbox import SandboxFileNotFound, make_sandbox
from openforge.sandbox.testing import backend_config, sandbox_backends
from tests.helpers.required import skip_or_fail

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=sandbox_backends())
def config(request: pytest.FixtureRequest) -> SandboxConfig:
    cfg, why = backend_config(request.param)
    if cfg is None:
        skip_or_fail(request.param, why)  # only "docker" can be required (CI installs it)
    return cfg


def _sandbox(config: SandboxConfig, rollout: str):
    return make_sandbox(config, run_id="run-test", rollout_id=f"ro-{rollout}-{os.getpid()}")


def local_pids(rollout_id: str) -> set[int]:
    """Every process on this machine that belongs to the local sandbox (by its env marker)."""
    found = set()
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("OPENFORGE_SANDBOX") == rollout_id:
                found.add(proc.pid)
        except psutil.Error:
            continue
    return found


async def leftover_processes(sb) -> list[str]:  # type: ignore[no-untyped-def]
    """Command lines of the sandbox's processes other than the backend's own (init, sleep)."""
    if sb.info.backend == "local":
        return [" ".join(psutil.Process(p).cmdline()) for p in local_pids(sb.info.sandbox_id)]
    res = await sb.exec("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done", timeout=10)
    return [line for line in res.stdout.splitlines() if "sleep 60" in line]


def docker_containers(rollout_id: str) -> list:
    import docker

    client = docker.DockerClient(base_url=os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock")
    try:
        return client.containers.list(all=True, filters={"label": f"openforge.rollout={rollout_id}"})
    finally:
        client.close()


async def test_exec_exit_codes_streams_env_cwd_stdin(config: SandboxConfig) -> None:
    async with _sandbox(config, "exec") as sb:
        res = await sb.exec("echo out; echo err >&2; exit 3", timeout=10)
        assert (res.exit_code, res.stdout, res.stderr, res.timed_out) == (3, "out\n", "err\n", False)
        res = await sb.exec(["sh", "-c", 'printf "%s|%s" "$GREETING" "$(pwd)"'], timeout=10,
                            env={"GREETING": "hello world"})
        assert res.stdout == f"hello world|{sb.info.workdir}"
        await sb.exec("mkdir -p sub/dir", timeout=10)
        assert (await sb.exec("pwd", timeout=10, cwd="sub/dir")).stdout.strip() == f"{sb.info.workdir}/sub/dir"
        assert (await sb.exec("tr a-z A-Z", timeout=10, stdin=b"shout")).stdout == "SHOUT"
        assert (await sb.exec("kill -9 $$", timeout=10)).exit_code == 128 + 9
        assert (await sb.exec(["no-such-program-xyz"], timeout=10)).exit_code == 127


async def test_environment_does_not_leak_from_the_caller(config: SandboxConfig, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-of-the-host")
    async with _sandbox(config, "env") as sb:
        res = await sb.exec("env", timeout=10)
        assert "sk-secret-of-the-host" not in res.stdout


async def test_timeout_kills_the_command_and_its_children(config: SandboxConfig) -> None:
    async with _sandbox(config, "timeout") as sb:
        res = await sb.exec("sleep 60 & sleep 60 & sleep 60", timeout=1)
        assert res.timed_out and res.exit_code == 124
        assert res.duration_s < 10
        await asyncio.sleep(0.2)
        assert await leftover_processes(sb) == []


async def test_output_cap_keeps_the_head_and_says_so(config: SandboxConfig) -> None:
    async with _sandbox(config, "cap") as sb:
        res = await sb.exec("i=0; while [ $i -lt 2000 ]; do echo line$i; i=$((i+1)); done; echo e >&2",
                            timeout=20, max_output=1000)
        assert res.truncated and len(res.stdout) == 1000 and res.stdout.startswith("line0\nline1\n")
        assert res.stderr == "e\n" and res.exit_code == 0
        small = await sb.exec("echo small", timeout=10, max_output=1000)
        assert not small.truncated and small.stdout == "small\n"


async def test_files_round_trip_binary_and_text(config: SandboxConfig) -> None:
    blob = bytes(range(256)) * 300
    async with _sandbox(config, "files") as sb:
        await sb.write_file("a/b/blob.bin", blob)
        await sb.write_file("run.sh", b"#!/bin/sh\necho ran\n", mode=0o755)
        assert await sb.read_file("a/b/blob.bin") == blob
        assert await sb.read_file(f"{sb.info.workdir}/a/b/blob.bin", max_bytes=10) == blob[:10]
        assert (await sb.exec("./run.sh && wc -c < a/b/blob.bin", timeout=10)).stdout.split() == ["ran", "76800"]
        await sb.exec("printf made > made.txt", timeout=10)
        assert await sb.read_file("made.txt") == b"made"
        with pytest.raises(SandboxFileNotFound):
            await sb.read_file("missing.txt")


async def test_paths_cannot_escape_the_workdir(config: SandboxConfig) -> None:
    async with _sandbox(config, "escape") as sb:
        for bad in ("../outside.txt", "a/../../../etc/passwd", ".."):
            with pytest.raises(SandboxError, match="leaves the sandbox"):
                await sb.write_file(bad, b"x")
            with pytest.raises(SandboxError, match="leaves the sandbox"):
                await sb.read_file(bad)
        # $HOME is writable by absolute path on every backend (harness config files go there).
        await sb.write_file(f"{sb.info.home}/.config/h.toml", b"k = 1")
        assert (await sb.exec("cat $HOME/.config/h.toml", timeout=10)).stdout == "k = 1"
        if sb.info.backend == "local":  # host paths and symlinks planted inside stay out of reach
            with pytest.raises(SandboxError, match="leaves the sandbox"):
                await sb.write_file("/etc/forge-owned", b"x")
            await sb.exec("ln -s /etc sneaky", timeout=10)
            with pytest.raises(SandboxError, match="leaves the sandbox"):
                await sb.write_file("sneaky/owned", b"x")
            assert not os.path.exists("/etc/owned")
        if getattr(sb, "bwrap", None):  # under bwrap the process itself cannot write outside its folder
            outside = f"/tmp/forge-escape-{os.getpid()}"
            # /tmp is the sandbox's own (a tmpfs): a file made there never reaches the host's /tmp.
            res = await sb.exec(f"touch {outside}; touch /usr/forge-owned; echo hi > $HOME/ok; "
                                "echo hi > $TMPDIR/ok", timeout=10)
            assert "Read-only file system" in res.stderr and not os.path.exists(outside)
            assert not os.path.exists("/usr/forge-owned")
            assert (await sb.exec("cat $HOME/ok $TMPDIR/ok", timeout=10)).stdout == "hi\nhi\n"


async def test_stop_removes_everything_and_is_idempotent(config: SandboxConfig) -> None:
    sb = _sandbox(config, "stop")
    await sb.start()
    rollout = sb.info.labels["openforge.rollout"]
    # A process that runs in the background and one that left the process group (setsid).
    await sb.exec("(setsid sleep 60 >/dev/null 2>&1 &) ; sleep 60 >/dev/null 2>&1 &", timeout=10)
    await sb.stop()
    await sb.stop()
    if sb.info.backend == "local":
        assert not sb.dir.exists()
        assert local_pids(rollout) == set()
        assert all(not d.exists() for d in (sb.cgroup.dirs if sb.cgroup else []))
    else:
        assert docker_containers(rollout) == []
        assert docker_volumes_left(sb) == []  # the workdir, HOME and /tmp volumes went with it


def docker_volumes_left(sb) -> list:  # type: ignore[no-untyped-def]
    import docker

    client = docker.DockerClient(base_url=os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock")
    try:
        names = {v.name for v in client.volumes.list()}
        return [v for v in sb.volume_names if v in names]
    finally:
        client.close()


async def test_cancellation_inside_the_context_still_cleans_up(config: SandboxConfig) -> None:
    sb = _sandbox(config, "cancel")
    rollout = sb.info.labels["openforge.rollout"]

    async def rollout_body() -> None:
        async with sb:
            await sb.exec("sleep 60", timeout=30)

    task = asyncio.ensure_future(rollout_body())
    await asyncio.sleep(1.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    if sb.info.backend == "local":
        assert not sb.dir.exists() and local_pids(rollout) == set()
    else:
        assert docker_containers(rollout) == []


def test_exec_reaper_kills_marked_processes_setsid_included_and_spares_the_rest() -> None:
    """The script each docker or pod exec ends with, run here against host processes: every process whose
    environ holds the exec's marker dies (a setsid'd one too); others live; it ends in bounded time
    even when an `env -i` process (empty environ, as a child inside execve reads) keeps asking for
    another pass."""
    import secrets
    import subprocess

    from openforge.sandbox.base import KILL_MARKED_SH

    marker = f"OPENFORGE_EXEC={secrets.token_hex(8)}"
    marked_env = {**os.environ, "OPENFORGE_EXEC": marker.partition("=")[2]}
    procs = [subprocess.Popen(["sleep", "60"], env=marked_env),
             subprocess.Popen(["sleep", "60"], env=marked_env, start_new_session=True),
             subprocess.Popen(["sleep", "60"]), subprocess.Popen(["env", "-i", "sleep", "60"])]
    try:
        subprocess.run(["sh", "-c", KILL_MARKED_SH, "sh", marker], timeout=30, check=True)
        for proc in procs[:2]:
            assert proc.wait(timeout=10) == -9
        assert [proc.poll() for proc in procs[2:]] == [None, None]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


async def test_exec_before_start_is_a_clear_error(config: SandboxConfig) -> None:
    sb = _sandbox(config, "unstarted")
    with pytest.raises(SandboxError, match="not started"):
        await sb.exec("true", timeout=5)
    await sb.stop()  # stop of a never-started sandbox is a no-op, not an error


async def test_background_child_ends_with_its_exec_and_does_not_hold_it_open(config: SandboxConfig) -> None:
    gc.collect()
    fds_before = len(os.listdir("/proc/self/fd"))
    async with _sandbox(config, "bg") as sb:
        res = await sb.exec("sleep 60 & echo started", timeout=20)
        assert (res.exit_code, res.stdout, res.timed_out) == (0, "started\n", False)
        assert res.duration_s < 10  # not held open by the child's copy of stdout
        await asyncio.sleep(0.2)
        assert await leftover_processes(sb) == []
        for _ in range(10):
            await sb.exec("echo x; echo y >&2", timeout=10, stdin=b"in")
        if sb.info.backend == "local":  # docker's SDK pools sockets until its client closes
            assert len(os.listdir("/proc/self/fd")) <= fds_before + 2
    gc.collect()  # the SDK's responses sit in reference cycles; what a cycle holds is not a leak
    assert len(os.listdir("/proc/self/fd")) <= fds_before + 2  # no pipe, file or socket left open
