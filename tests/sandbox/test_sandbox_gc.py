"""`forge gc` removes what a crashed run left, by label, and spares live runs; the Docker backend's
failures are one clear line; the factory; the locally built images."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from openforge.forge_cli.main import app
from openforge.config import DockerSandboxConfig, KubernetesSandboxConfig, LocalSandboxConfig
from openforge.errors import SandboxError
from openforge.store import Store
from openforge.sandbox import make_sandbox
from openforge.sandbox.docker import DockerSandbox
from openforge.sandbox.local import LocalSandbox
from openforge.sandbox.procs import Cgroup, Limits
from openforge.sandbox.testing import backend_config, docker_image
from tests.helpers.required import skip_or_fail

pytestmark = pytest.mark.timeout(120)
runner = CliRunner()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


async def _crashed_local(run_id: str, rollout_id: str) -> tuple[LocalSandbox, int]:
    """A local sandbox whose owner died without stop(): its folder and a setsid'd process remain."""
    config = LocalSandboxConfig(isolation="none")  # plain mode: the stray survives its exec only if it escapes
    sb = LocalSandbox(config, run_id=run_id, rollout_id=rollout_id)
    await sb.start()
    stray = subprocess.Popen(["sleep", "120"], env={**os.environ, "OPENFORGE_SANDBOX": rollout_id},
                             start_new_session=True)
    meta = sb.dir / "sandbox.json"
    data = json.loads(meta.read_text())
    data["owner_pid"] = _dead_pid()
    meta.write_text(json.dumps(data))
    return sb, stray.pid


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_gc_removes_a_crashed_local_sandbox_and_its_processes(store: Store, forge_home: Path) -> None:
    crashed, stray = await _crashed_local("run-crashed", "ro-crashed")
    # A live run's sandbox (owner = this process, run running) must survive the sweep.
    live_run = store.create_run(name="live", owner_pid=os.getpid())
    store.set_run_status(live_run.id, "running")
    live = LocalSandbox(LocalSandboxConfig(), run_id=live_run.id, rollout_id="ro-live")
    await live.start()
    # A cgroup whose owner died between start and stop (only where this machine lets us make one).
    orphan = Cgroup(f"ro-orphan.{_dead_pid()}", Limits(1, 64, 8, 1))
    try:
        dry = runner.invoke(app, ["gc", "--dry-run"], catch_exceptions=False)
        assert dry.exit_code == 0 and "would remove local" in dry.stdout and crashed.dir.exists()
        result = runner.invoke(app, ["gc"], catch_exceptions=False)
        assert result.exit_code == 0, result.stdout
        assert f"removed local {crashed.dir}" in result.stdout and "1 live run(s) left alone" in result.stdout
        assert not crashed.dir.exists()
        psutil.wait_procs([psutil.Process(stray)], timeout=5) if _alive(stray) else None
        assert not _alive(stray)
        assert live.dir.exists()
        assert all(not d.exists() for d in orphan.dirs)
        assert all(d.exists() for d in (live.cgroup.dirs if live.cgroup else []))
        # Asked by run id, even a live run's sandboxes go.
        by_run = runner.invoke(app, ["gc", "--run", live_run.id], catch_exceptions=False)
        assert by_run.exit_code == 0 and not live.dir.exists()
    finally:
        await live.stop()
        await crashed.stop()
        orphan.remove()


async def test_gc_removes_leftover_containers_by_label(store: Store) -> None:
    config, why = backend_config("docker")
    if config is None:
        skip_or_fail("docker", why)
    run = store.create_run(name="crashed", owner_pid=_dead_pid())
    store.set_run_status(run.id, "running")  # what a crash leaves: "running", owner gone
    sb = DockerSandbox(config, run_id=run.id, rollout_id=f"ro-gc-{os.getpid()}")
    await sb.start()  # ...and never stopped
    name = sb.name
    try:
        # --run scopes the sweep to this run, so containers of anything else on the engine are safe.
        result = runner.invoke(app, ["gc", "--run", run.id], catch_exceptions=False)
        assert result.exit_code == 0 and f"removed docker {name}" in result.stdout
        import docker

        client = docker.DockerClient(base_url=os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock")
        assert client.containers.list(all=True, filters={"name": name}) == []
        assert sb.volume_names and not {v.name for v in client.volumes.list()} & set(sb.volume_names)
        client.close()
    finally:
        await sb.stop()


async def test_docker_failures_say_what_to_do() -> None:
    config = DockerSandboxConfig(base_url="unix:///nonexistent/docker.sock")
    with pytest.raises(SandboxError, match=r"no Docker engine reachable at unix:///nonexistent.*sandbox.type"):
        async with make_sandbox(config, run_id="r", rollout_id="ro-nodocker"):
            pass
    ok, why = backend_config("docker")
    if ok is None:
        skip_or_fail("docker", why)
    ok.image = "openforge-sandbox:no-such-tag"  # type: ignore[union-attr]
    with pytest.raises(SandboxError, match="image openforge-sandbox:no-such-tag not found; build it with"):
        async with make_sandbox(ok, run_id="r", rollout_id="ro-noimage"):
            pass


def test_factory_picks_the_backend_by_type() -> None:
    assert isinstance(make_sandbox(LocalSandboxConfig(), run_id="r", rollout_id="a"), LocalSandbox)
    assert isinstance(make_sandbox(DockerSandboxConfig(), run_id="r", rollout_id="a"), DockerSandbox)
    k8s = make_sandbox(KubernetesSandboxConfig(), run_id="r", rollout_id="a")
    assert type(k8s).__name__ == "KubernetesSandbox"


def test_gc_is_one_clear_line_for_an_unknown_run() -> None:
    result = runner.invoke(app, ["gc", "--run", "run-nope"])
    assert result.exit_code == 1 and result.stderr.startswith("forge: error:")


async def test_python_image_runs_the_openai_sdk_on_the_host_network() -> None:
    """The image the `mini` harness runs in: python3 + openai, and the host's loopback reachable."""
    tag, why = docker_image("python")
    if tag is None:
        skip_or_fail("docker", why)
    import http.server
    import threading

    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = DockerSandboxConfig(image=tag, network="host")  # not the default: "none" reaches nothing
    try:
        async with make_sandbox(config, run_id="r", rollout_id=f"ro-py-{os.getpid()}") as sb:
            code = ("import openai, urllib.request; "
                    f"print(openai.__version__, urllib.request.urlopen('http://127.0.0.1:{server.server_port}/').status)")
            res = await sb.exec(["python3", "-c", code], timeout=60)
            assert res.exit_code == 0, res.stderr
            assert res.stdout.split()[1] == "200"
    finally:
        server.shutdown()


def test_gc_asks_the_kubernetes_backend_only_when_no_run_is_live(store: Store, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    result = runner.invoke(app, ["gc", "--kubernetes"], catch_exceptions=False)
    assert result.exit_code == 0 and "kubernetes: skipped (" in result.stdout  # it tried, and said why
    run = store.create_run(name="live", owner_pid=os.getpid())
    store.set_run_status(run.id, "running")
    result = runner.invoke(app, ["gc", "--kubernetes"], catch_exceptions=False)
    assert "kubernetes: skipped (a run is live; pass --run RUN" in result.stdout


class _FlakyLocal(LocalSandbox):
    """A real local sandbox whose first starts fail as a busy engine's do (or with a permanent error)."""

    def __init__(self, failures: int, exc: type[SandboxError]) -> None:
        config = LocalSandboxConfig(start_retries=2)
        super().__init__(config, run_id="r", rollout_id=f"ro-flaky-{failures}-{exc.__name__}")
        self.failures, self.exc, self.starts = failures, exc, 0

    async def start(self) -> None:
        self.starts += 1
        if self.starts <= self.failures:
            raise self.exc(f"start {self.starts} failed")
        await super().start()


async def test_async_with_retries_transient_start_failures_only() -> None:
    from openforge.sandbox.base import TransientSandboxError

    sb = _FlakyLocal(2, TransientSandboxError)
    async with sb:
        assert (await sb.exec("echo up", timeout=10)).stdout == "up\n"
    assert sb.starts == 3 and not sb.dir.exists()
    gives_up = _FlakyLocal(5, TransientSandboxError)
    with pytest.raises(TransientSandboxError, match="start 3 failed"):
        async with gives_up:
            pass
    permanent = _FlakyLocal(1, SandboxError)  # image missing, engine unreachable: no point retrying
    with pytest.raises(SandboxError, match="start 1 failed"):
        async with permanent:
            pass
    assert permanent.starts == 1


async def test_a_forged_sandbox_json_cannot_make_gc_kill_another_sandbox(store: Store, forge_home: Path) -> None:
    """The attacker's folder claims to be the victim's rollout (as an unisolated agent could write it):
    gc removes the attacker's folder and kills its processes, never the victim's."""
    live_run = store.create_run(name="live", owner_pid=os.getpid())
    store.set_run_status(live_run.id, "running")
    victim = LocalSandbox(LocalSandboxConfig(isolation="none"), run_id=live_run.id, rollout_id="ro-victim")
    await victim.start()
    victim_proc = subprocess.Popen(["sleep", "120"], env={**os.environ, "OPENFORGE_SANDBOX": "ro-victim"},
                                   start_new_session=True)
    attacker, attacker_stray = await _crashed_local("run-crashed", "ro-attacker")
    meta = attacker.dir / "sandbox.json"
    forged = json.loads(meta.read_text())
    forged["labels"]["openforge.rollout"] = "ro-victim"
    meta.write_text(json.dumps(forged))
    try:
        result = runner.invoke(app, ["gc"], catch_exceptions=False)
        assert result.exit_code == 0 and f"removed local {attacker.dir}" in result.stdout
        assert not attacker.dir.exists() and victim.dir.exists()
        assert _alive(victim_proc.pid)
        psutil.wait_procs([psutil.Process(attacker_stray)], timeout=5) if _alive(attacker_stray) else None
        assert not _alive(attacker_stray)  # the attacker's own processes, found by its folder's name
    finally:
        victim_proc.kill()
        victim_proc.wait()
        await victim.stop()
        await attacker.stop()


# A maker that dies leaving its owned folder and a process working in it (a task service, a tool handler).
_MAKER = """
import subprocess, sys
from openforge.sandbox.gc import owned_tempdir
folder = owned_tempdir("forge-services-", dir=sys.argv[1])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], cwd=folder, start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(folder, child.pid, flush=True)
"""


def test_gc_sweeps_host_folders_whose_maker_died(tmp_path: Path) -> None:
    """`forge gc` after a crash: a rollout's host-side folder (services, MCP server, exposed sockets) is
    removed with what still runs in it once its maker is gone; a live maker's folder is left alone."""
    from openforge.sandbox.gc import OWNER_SUFFIX, collect_owned_folders, owned_tempdir, remove_owned

    out = subprocess.run([sys.executable, "-c", _MAKER, str(tmp_path)], capture_output=True, text=True, timeout=60)
    folder, pid = out.stdout.split()
    orphan = psutil.Process(int(pid))
    assert orphan.is_running() and Path(folder).is_dir()
    mine = owned_tempdir("forge-mcp-", dir=tmp_path)  # this process is alive: not a leftover
    try:
        assert [f.ident for f in collect_owned_folders(root=tmp_path, dry_run=True)] == [folder]
        assert orphan.is_running() and Path(folder).is_dir()  # a dry run removes nothing
        [found] = collect_owned_folders(root=tmp_path)
        assert (found.backend, found.ident, found.removed) == ("host", folder, True)
        orphan.wait(timeout=10)  # killed (SIGKILL), reaped by init
        assert not Path(folder).exists() and not Path(folder + OWNER_SUFFIX).exists()
        assert Path(mine).is_dir() and collect_owned_folders(root=tmp_path) == []
    finally:
        if orphan.is_running():
            orphan.kill()
        remove_owned(mine)
    assert not Path(mine).exists() and not Path(mine + OWNER_SUFFIX).exists()
