"""The sandbox as an adversary sees it: what an isolated local sandbox cannot do as root, the proxy's
unix socket as its only way out, and nothing the agent started surviving `kill_all()` (the escapes
of issue #13: setsid + env -i, a double fork, a cgroup move, a rewritten verifier file)."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from openforge.engine.serve import serve_in_thread
from openforge.config import DockerSandboxConfig, LocalSandboxConfig
from openforge.errors import SandboxError
from openforge.sandbox import IsolationUnavailable, isolation_check, make_sandbox
from openforge.sandbox.testing import backend_config
from tests.helpers.required import skip_or_fail

pytestmark = pytest.mark.timeout(120)
PROBE = ("import sys, urllib.request\n"
         "try:\n"
         "    print(urllib.request.urlopen(sys.argv[1], timeout=3).read().decode())\n"
         "except Exception as exc:\n"
         "    print('unreachable', type(exc).__name__)\n")


def _isolated(name: str = "local-bwrap"):  # type: ignore[no-untyped-def]
    cfg, why = backend_config(name)
    if cfg is None:
        skip_or_fail(name, why)  # only "docker" can be required (CI installs it)
    return cfg


@pytest.fixture
def servers():  # type: ignore[no-untyped-def]
    """A 'proxy' on a unix socket and an 'engine' on the host's 127.0.0.1 (what a sandbox must not reach)."""
    app = Starlette(routes=[Route("/", lambda request: PlainTextResponse("proxy says hi"))])
    engine = Starlette(routes=[Route("/", lambda request: PlainTextResponse("engine weights here"))])
    folder = tempfile.mkdtemp(prefix="forge-t-")
    sock = os.path.join(folder, "proxy.sock")
    proxy = serve_in_thread(app, "127.0.0.1", 0, uds=sock)
    eng = serve_in_thread(engine, "127.0.0.1", 0)
    yield sock, eng.url
    proxy.stop()
    eng.stop()


async def test_root_in_the_sandbox_cannot_remount_read_shadow_or_see_the_store(forge_home: Path) -> None:
    (forge_home / "forge.db").write_bytes(b"SQLite format 3\0 secret rollout keys")
    async with make_sandbox(_isolated(), run_id="run-iso", rollout_id=f"ro-iso-{os.getpid()}") as sb:
        res = await sb.exec("mount -o remount,bind,rw /; echo remount=$?; cat /etc/shadow; echo shadow=$?; "
                            f"cat {forge_home}/forge.db; echo store=$?; ls /root /home 2>&1 | wc -l; "
                            "grep CapEff /proc/self/status; touch /usr/owned; echo usr=$?", timeout=20)
        out = res.stdout
        assert "remount=0" not in out and "remount=" in out
        assert "shadow=1" in out and "store=1" in out and "usr=1" in out
        assert "CapEff:\t0000000000000000" in out
        assert "secret" not in out and not os.path.exists("/usr/owned")
        meta = await sb.exec("cat ../sandbox.json; echo rc=$?", timeout=10)  # the labels are out of reach
        assert "rc=1" in meta.stdout and "openforge.run" not in meta.stdout


async def test_the_proxy_socket_is_the_only_way_out(servers) -> None:  # type: ignore[no-untyped-def]
    sock, engine_url = servers
    sb = make_sandbox(_isolated(), run_id="run-net", rollout_id=f"ro-net-{os.getpid()}", proxy_socket=sock)
    async with sb:
        await sb.write_file("probe.py", PROBE.encode())
        assert sb.proxy_url and sb.proxy_url.startswith("http://127.0.0.1:")
        via_proxy = await sb.exec([sys.executable, "probe.py", sb.proxy_url + "/"], timeout=30)
        assert via_proxy.stdout.strip() == "proxy says hi", via_proxy.stderr
        to_engine = await sb.exec([sys.executable, "probe.py", engine_url + "/"], timeout=30)
        assert to_engine.stdout.startswith("unreachable"), to_engine.stdout
        # Nothing else either: no interface but loopback, so no route to any other host.
        routes = await sb.exec("cat /proc/net/route | wc -l; ls /sys/class/net 2>/dev/null", timeout=10)
        assert routes.stdout.split()[0] == "1"  # the header line only


def test_no_isolation_is_refused_with_the_fix_unless_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    from openforge.sandbox import local as sandbox_local

    monkeypatch.setattr(sandbox_local, "bwrap_usable", lambda: None)
    with pytest.raises(IsolationUnavailable, match=r"apt-get install bubblewrap.*isolation = \"none\""):
        isolation_check(LocalSandboxConfig())
    assert isolation_check(LocalSandboxConfig(isolation="none")).name == "none"
    assert isolation_check(DockerSandboxConfig()).name == "docker"


async def test_a_local_sandbox_never_starts_unisolated_by_accident(monkeypatch: pytest.MonkeyPatch) -> None:
    from openforge.sandbox import local as sandbox_local

    monkeypatch.setattr(sandbox_local, "bwrap_usable", lambda: None)
    with pytest.raises(IsolationUnavailable):
        async with make_sandbox(LocalSandboxConfig(), run_id="r", rollout_id=f"ro-noiso-{os.getpid()}"):
            pass


# The agent's escapes: each starts something meant to rewrite the verifier's file after the agent's exec.
# Each write is a rename, so a loop killed mid-write never leaves an empty file behind.
ESCAPES = {
    "setsid-env-i": "setsid env -i /bin/sh -c 'while :; do echo \"score: 1\" > {f}.w 2>/dev/null && mv -f {f}.w {f}; "
                    "sleep 0.05; done' >/dev/null 2>&1 < /dev/null &",
    "double-fork": "( ( while :; do echo 'score: 1' > {f}.w && mv -f {f}.w {f}; sleep 0.05; done ) >/dev/null 2>&1 & ) &",
    "cgroup-move": "( for c in /sys/fs/cgroup/cgroup.procs /sys/fs/cgroup/pids/cgroup.procs; do "
                   "echo $$ > $c 2>/dev/null; done; while :; do echo 'score: 1' > {f}.w && mv -f {f}.w {f}; "
                   "sleep 0.05; done ) >/dev/null 2>&1 &",
}


@pytest.mark.parametrize("backend", ["local-bwrap", "docker"])
@pytest.mark.parametrize("escape", sorted(ESCAPES))
async def test_nothing_the_agent_started_outlives_kill_all(backend: str, escape: str) -> None:
    cfg = _isolated(backend) if backend != "docker" else backend_config("docker")[0]
    if cfg is None:
        skip_or_fail("docker", backend_config("docker")[1])
    async with make_sandbox(cfg, run_id="run-esc", rollout_id=f"ro-{escape}-{os.getpid()}") as sb:
        verdict = f"{sb.info.workdir}/verdict.txt"
        # The agent's exec returns at once, leaving its helper running (if the backend let it).
        # (It waits until the helper is set up, so the helper has dropped what marks the exec's processes.)
        done = await sb.exec(ESCAPES[escape].format(f=verdict) + " sleep 0.5", timeout=30)
        assert done.exit_code == 0, done.stderr
        await asyncio.sleep(0.3)
        if backend == "docker":  # one long-lived container: the escape ran (the setsid one is alive until
            # kill_all; the others kept the exec's marker and its own reaper already ended them)
            assert await _reads(sb, "verdict.txt", b"score: 1\n"), "the escape's loop never ran"
        await sb.kill_all()
        await sb.write_file("verdict.txt", b"score: 0\n")  # the verifier's fresh file, written after kill_all
        await asyncio.sleep(0.5)
        assert await sb.read_file("verdict.txt") == b"score: 0\n"
        assert (await sb.exec("echo alive", timeout=10)).stdout == "alive\n"  # the verifier can still run


@pytest.mark.parametrize("backend", ["local-bwrap", "docker"])
async def test_the_agent_killing_all_it_can_does_not_end_its_sandbox(backend: str) -> None:
    """`kill -9 -1` (and at PID 1) from the agent ends its own processes only: before the keeper ran
    as uid 0 it also ended the container's keeper, so the container, and the rollout's zero became an
    infrastructure failure (its group dropped)."""
    cfg, why = backend_config(backend)
    if cfg is None:
        skip_or_fail(backend, why)
    async with make_sandbox(cfg, run_id="run-kill", rollout_id=f"ro-killall-{os.getpid()}") as sb:
        done = await sb.exec("sleep 30 & kill -9 1; kill -9 -1; echo survived", timeout=30)
        assert not done.timed_out and done.exit_code in (0, 137), done  # 137: its own shell went too
        await asyncio.sleep(0.3)
        assert (await sb.exec("echo alive", timeout=10)).stdout == "alive\n"
        await sb.kill_all()
        assert (await sb.exec("echo still", timeout=10)).stdout == "still\n"


async def _reads(sb, path: str, want: bytes, within_s: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + within_s
    while asyncio.get_running_loop().time() < deadline:
        if await sb.read_file(path) == want:
            return True
        await asyncio.sleep(0.05)
    return False


async def test_kill_all_before_start_is_harmless() -> None:
    sb = make_sandbox(LocalSandboxConfig(isolation="none"), run_id="r", rollout_id=f"ro-unstarted-{os.getpid()}")
    await sb.kill_all()
    with pytest.raises(SandboxError, match="not started"):
        await sb.exec("true", timeout=5)


async def test_a_container_without_network_reaches_only_the_proxy(servers) -> None:  # type: ignore[no-untyped-def]
    from openforge.sandbox.testing import docker_image

    tag, why = docker_image("python")  # the forwarder runs on the image's python3
    if tag is None:
        skip_or_fail("docker", why)
    sock, engine_url = servers
    cfg = DockerSandboxConfig(image=tag, network="none")
    async with make_sandbox(cfg, run_id="run-net", rollout_id=f"ro-dnet-{os.getpid()}", proxy_socket=sock) as sb:
        await sb.write_file("probe.py", PROBE.encode())
        assert sb.proxy_url and sb.proxy_url.startswith("http://127.0.0.1:")
        via_proxy = await sb.exec(["python3", "probe.py", sb.proxy_url + "/"], timeout=30)
        assert via_proxy.stdout.strip() == "proxy says hi", via_proxy.stderr
        to_engine = await sb.exec(["python3", "probe.py", engine_url + "/"], timeout=30)
        assert to_engine.stdout.startswith("unreachable"), to_engine.stdout


async def test_a_container_runs_as_the_sandbox_user_with_no_privileges() -> None:
    """Issue 13's leftover: uid 1000 (as the Kubernetes pods), every capability dropped, no new
    privileges (setuid binaries give nothing), a read-only root; the workdir, $HOME and /tmp writable."""
    cfg, why = backend_config("docker")
    if cfg is None:
        skip_or_fail("docker", why)
    async with make_sandbox(cfg, run_id="run-user", rollout_id=f"ro-user-{os.getpid()}") as sb:
        got = await sb.exec('id -u; id -g; echo "$HOME"; grep -E "^(CapPrm|CapEff|CapBnd|NoNewPrivs)" /proc/self/status',
                            timeout=30)
        assert got.stdout.splitlines() == ["1000", "1000", "/home/forge", "CapPrm:\t0000000000000000",
                                           "CapEff:\t0000000000000000", "CapBnd:\t0000000000000000",
                                           "NoNewPrivs:\t1"], got
        for path in ("/x", "/etc/passwd", "/bin/sh", "/root/x"):
            wrote = await sb.exec(f"echo pwned >> {path}", timeout=30)
            assert wrote.exit_code != 0 and ("Read-only" in wrote.stderr or "denied" in wrote.stderr), (path, wrote)
        mounted = await sb.exec("mount -o remount,rw / 2>&1; touch /x 2>&1", timeout=30)
        assert "Read-only file system" in mounted.stdout, mounted
        writes = await sb.exec('for d in "$PWD" "$HOME" /tmp; do echo ok > "$d/f" && cat "$d/f"; done', timeout=30)
        assert (writes.exit_code, writes.stdout) == (0, "ok\nok\nok\n"), writes
        await sb.write_file("deep/er/f.txt", b"from the host")  # parents the host creates are the user's too
        appended = await sb.exec("echo more >> deep/er/f.txt && touch deep/er/g && stat -c %u deep deep/er/f.txt",
                                 timeout=30)
        assert (appended.exit_code, appended.stdout) == (0, "1000\n1000\n"), appended
        with pytest.raises(SandboxError, match="read-only"):
            await sb.write_file("/etc/forge", b"no")
