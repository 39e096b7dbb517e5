"""GUI rollouts on the Docker backend: builtin-web tasks run unchanged with `sandbox.type = "docker"` and the
browser image, in a container with network `none`, as the sandbox's unprivileged user, every capability
dropped and a read-only root. The task's site is served on the host (rollouts/tasks/web/server.py) and reached
only through its unix socket, whose private folder is bound read-only; the grade is read on the host.

Skipped, with the reason, without a Docker engine or without the browser image (an import of its cached
rootfs tarball is fine; a build is not: ~10 minutes)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from openforge.config import DockerSandboxConfig, ForgeConfig, HarnessConfig
from openforge.errors import SandboxError
from openforge.sandbox.base import SandboxBase
from openforge.store import Store
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.selfcheck import _StandInHarness
from openforge.rollouts.tasks.format import TaskSpec, load_tasks
from openforge.rollouts.tasks.web.payload import WebPayload
from tests.helpers.containers import browser_image
from tests.helpers.required import skip_or_fail

BY_ID = {t.id: t for t in load_tasks("builtin-web")}


@pytest.fixture(scope="module")
def image() -> str:
    return browser_image()


def docker_config(image: str, **extra: Any) -> ForgeConfig:
    cfg = ForgeConfig()
    cfg.sandbox = DockerSandboxConfig(image=image, **extra)
    cfg.runner.time_limit_scale = 3.0  # chromium's start on 2 loaded cores
    return cfg


SITE_SOCKETS: list[str] = []  # every site socket the runner gave a sandbox factory in this module


def recording(factory: Any) -> Any:
    def make(config: Any, **kw: Any) -> Any:
        if kw.get("site_socket"):
            SITE_SOCKETS.append(str(kw["site_socket"]))
        return factory(config, **kw)
    return make


async def run_tasks(store: Store, cfg: ForgeConfig, tasks: list[TaskSpec], harness: Any, **runner: Any) -> list[Any]:
    from openforge.sandbox.factory import make_sandbox

    run = store.create_run(kind="check", name="gui on docker")
    runner["sandbox_factory"] = recording(runner.get("sandbox_factory") or make_sandbox)
    return await RolloutRunner(store, config=cfg, proxy_url="http://127.0.0.1:9", harness=harness,
                               **runner).run(run.id, [RolloutSpec(t) for t in tasks])


def sites_left() -> list[str]:
    """The site folders of this module's rollouts still on disk (each is removed when its site closes)."""
    assert SITE_SOCKETS, "no site was opened"
    return [s for s in SITE_SOCKETS if os.path.exists(os.path.dirname(s))]


def containers_of(run_id: str) -> list[Any]:
    from openforge.sandbox.base import LABEL_RUN
    from openforge.sandbox.docker_engine import connect

    client = connect(timeout=10)
    try:
        return client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_id}"})
    finally:
        client.close()


# -- (1) real GUI rollouts through the runner ---------------------------------------------------------

@pytest.mark.slow
async def test_reference_solutions_score_one_and_wrong_actions_zero_on_docker(store: Store, image: str) -> None:
    """The reference solution of a kiosk task (a click in the shop) and of an --app window task score 1,
    graded by the site's state on the host; clicking the wrong button and doing nothing score 0.
    Nothing is left: no container, no site folder."""
    cfg = docker_config(image)
    mug, notes, red = BY_ID["web-shop-cheapest-mug"], BY_ID["desktop-notes-write"], BY_ID["gui-colour-click-red"]
    wrong_click = red.solution.replace("click 256 192", "click 768 192")  # type: ignore[union-attr]
    assert wrong_click != red.solution
    solved = _StandInHarness({mug.id: mug.solution or "", notes.id: notes.solution or ""})
    out = await run_tasks(store, cfg, [mug, notes], solved)
    for ro in out:
        assert (ro.status, ro.reward, ro.sandbox) == ("scored", 1.0, "docker"), (ro.error, ro.verifier_output,
                                                                                ro.stdout, ro.stderr)
        assert "site state: ok" in ro.verifier_output
    hostile = _StandInHarness({red.id: wrong_click})
    [ro] = await run_tasks(store, cfg, [red], hostile)
    assert (ro.status, ro.reward) == ("scored", 0.0), (ro.error, ro.stderr)
    assert 'site state: wrong: expected {"clicks": ["red"]}' in ro.verifier_output, ro.verifier_output
    assert '"clicks": ["' in ro.verifier_output  # it did click (another colour): graded, not an empty page
    [ro] = await run_tasks(store, cfg, [mug], _StandInHarness({}, {mug.id: ""}))
    assert (ro.status, ro.reward) == ("scored", 0.0), (ro.error, ro.stderr)
    assert [c for r in store.list_runs() for c in containers_of(r.id)] == []
    assert sites_left() == []


# -- (2) what the agent can do inside the GUI container -----------------------------------------------

# Run inside, in the GUI exec (the display, chromium on the site, the site forwarder): what it can reach,
# write and read. The state marker is given in two halves so that no process's environment or command
# line holds it whole; only the site's memory on the host does.
PROBE = r'''
import json, os, socket, sys, urllib.request, urllib.error
out = {"uid": os.getuid(), "cap_eff": next(l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")),
       "interfaces": sorted(l.split(":")[0].strip() for l in open("/proc/net/dev") if ":" in l)}
reach = {}
targets = [("127.0.0.1", 8080)] + [(h, int(p)) for h, p in (t.split(":") for t in os.environ["TARGETS"].split())]
for host, port in targets:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM); s.settimeout(3)
    try:
        s.connect((host, port)); reach[f"{host}:{port}"] = "connected"
    except OSError as exc:
        reach[f"{host}:{port}"] = type(exc).__name__
    finally:
        s.close()
u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    u.connect("\0" + os.environ["ABSTRACT"]); reach["abstract"] = "connected"
except OSError as exc:
    reach["abstract"] = type(exc).__name__
out["reach"] = reach
marker = os.environ["MARKER_A"] + os.environ["MARKER_B"]
pages = {}
for path in ("/", "/clicked", "/state", "/clicks", "/api/state", "/admin", "/../state"):
    try:
        with urllib.request.urlopen("http://127.0.0.1:8080" + path, timeout=10) as r:
            status, body = r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read().decode("utf-8", "replace")
    pages[path] = [status, marker in body]
out["pages"] = pages
found, scanned = [], 0
roots = ["/run", "/opt", "/tmp", "/etc", "/var", os.environ["HOME"], os.getcwd()]
for root in roots:
    for folder, _, files in os.walk(root):
        for name in files:
            p = os.path.join(folder, name)
            scanned += 1
            try:
                with open(p, "rb") as fh:
                    if marker.encode() in fh.read(4 << 20):
                        found.append(p)
            except OSError:
                pass
for pid in (d for d in os.listdir("/proc") if d.isdigit()):
    for part in ("environ", "cmdline"):
        try:
            if marker.encode() in open(f"/proc/{pid}/{part}", "rb").read():
                found.append(f"/proc/{pid}/{part}")
        except OSError:
            pass
out["marker_found"], out["scanned"] = found, scanned
out["display"] = os.environ.get("DISPLAY", "")
sys.path.insert(0, os.path.dirname(os.environ["FORGE_GUI"]))
import gui
out["screenshot"] = list(gui.screenshot().size)
print("PROBE " + json.dumps(out))
'''
WRITES = ('for t in /run/forge-site/x /opt/forge/x /etc/x /usr/x /x; do touch $t 2>/dev/null && echo "WROTE $t"; done; '
          'echo x >> "$FORGE_GUI" 2>/dev/null && echo "WROTE gui.py"; '
          'rm -f /run/forge-site/site.sock 2>/dev/null; [ -S /run/forge-site/site.sock ] || echo "SOCKET GONE"; '
          'mv /run/forge-site/site.sock /tmp/s 2>/dev/null && echo MOVED; '
          'chmod 777 /run/forge-site 2>/dev/null && echo CHMODDED; '
          'ls /run/forge-site >/dev/null 2>&1 && echo LISTED; '
          'ln -s /tmp /run/forge-site/l 2>/dev/null && echo LINKED; echo writes-done')
# The processes left in the container, by name (docker-init and the keeper `sleep` are its own).
PS = 'for p in /proc/[0-9]*; do cat $p/comm 2>/dev/null; done | sort | tr "\\n" " "'


def host_address() -> str:
    """This machine's address on its outside interface (a UDP connect sends nothing), else the loopback."""
    import socket

    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("10.255.255.1", 9))
        return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        s.close()


@pytest.mark.slow
async def test_the_gui_container_reaches_only_its_site_and_cannot_touch_the_socket_or_the_state(image: str) -> None:
    """In the GUI exec (a real display and chromium on the site): only `lo`; the site is reachable at
    127.0.0.1:8080 (the positive control), but not a TCP listener on the host's loopback or outside
    address, the Docker gateway, or an abstract unix socket on the host; the site socket's folder and
    gui.py cannot be written, listed or replaced; the state (on the host, holding a marker) is in no
    page, file or process inside. After the exec nothing of it runs; a browser detached without the exec's
    marker survives the exec, and kill_all ends it."""
    import secrets
    import socket

    from openforge.rollouts.tasks.web.server import SiteSession
    from openforge.sandbox.factory import make_sandbox

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("0.0.0.0", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"forge-test-{secrets.token_hex(6)}"
    abstract.bind("\0" + name)
    abstract.listen(4)
    with socket.create_connection(("127.0.0.1", port), timeout=5):  # the control: reachable from the host
        pass
    marker_a, marker_b = "forge-state-", secrets.token_hex(8)
    site = SiteSession(BY_ID["gui-colour-click-red"].payload(WebPayload).gui)  # type: ignore[arg-type,union-attr]
    site.site.clicks.append(marker_a + marker_b)  # type: ignore[attr-defined]
    targets = f"127.0.0.1:{port} {host_address()}:{port} 172.17.0.1:{port} 172.17.0.1:80 10.0.2.2:80 1.1.1.1:53"
    try:
        async with make_sandbox(DockerSandboxConfig(image=image), run_id="gui-docker-test",
                                rollout_id=f"gui-{secrets.token_hex(4)}", site_socket=site.socket_path) as sb:
            await sb.write_file("probe.py", PROBE.encode())
            sb.attach_gui(site.gui_spec())  # type: ignore[attr-defined]
            probe = await sb.exec(["sh", "-c", f'"$FORGE_PYTHON" -I probe.py; {WRITES}; '
                                   '(setsid env -i "$FORGE_PYTHON" -c "import time; time.sleep(600)" &); sleep 0.5'],
                                  timeout=240, env={"TARGETS": targets, "ABSTRACT": name, "MARKER_A": marker_a,
                                                    "MARKER_B": marker_b})
            sb.attach_gui(None)  # type: ignore[attr-defined]
            left = (await sb.exec(PS, timeout=30)).stdout
            await sb.kill_all()
            after = (await sb.exec(PS, timeout=30)).stdout
        assert os.listdir(site.folder) == ["site.sock"]  # nothing was added beside the socket
        assert marker_a + marker_b in site.state()["clicks"]  # the control: the state does hold it
    finally:
        site.close()
        listener.close()
        abstract.close()
    line = next((ln for ln in probe.stdout.splitlines() if ln.startswith("PROBE ")), None)
    assert probe.exit_code == 0 and line, (probe.exit_code, probe.stdout, probe.stderr)
    import json

    got = json.loads(line[6:])
    assert got["uid"] == 1000 and int(got["cap_eff"], 16) == 0, got
    assert got["interfaces"] == ["lo"], got
    assert got["reach"].pop("127.0.0.1:8080") == "connected", got  # the site, through its forwarder
    assert "connected" not in got["reach"].values(), got["reach"]
    assert got["pages"]["/"] == [200, False], got["pages"]
    assert all(status == 404 and not seen for path, (status, seen) in got["pages"].items()
               if path not in ("/", "/clicked")), got["pages"]
    assert got["marker_found"] == [] and got["scanned"] > 100, got
    assert got["display"].startswith(":") and got["screenshot"] == [1024, 768], got
    assert "WROTE" not in probe.stdout and "writes-done" in probe.stdout, probe.stdout
    for bad in ("SOCKET GONE", "MOVED", "CHMODDED", "LISTED", "LINKED"):
        assert bad not in probe.stdout, probe.stdout
    # the exec's own Xvfb, chromium and forwarder ended with it; only the detached sleeper is left
    assert not any(n in left for n in ("Xvfb", "chromium", "xdotool")), left
    assert "python3" in left, left
    assert set(after.split()) <= {"docker-init", "sleep", "sh", "cat", "sort", "tr"}, after  # PS itself


# -- (3) the runner: docker GUI tasks are run, the site is closed on every path -----------------------

class _Headless(SandboxBase):
    """A started sandbox without a display (`supports_gui` False), as a backend without GUI support is."""

    def __init__(self, config: Any, *, run_id: str, rollout_id: str, **kwargs: Any) -> None:
        from openforge.sandbox.base import SandboxInfo

        self.info = SandboxInfo(backend="plain", sandbox_id=rollout_id, workdir="/nowhere")
        self.kwargs, self.stopped = kwargs, False

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True


async def test_the_site_opens_before_the_sandbox_and_closes_on_every_path(store: Store) -> None:
    """The factory gets the site's socket (already served); a start failure and a sandbox without a
    display are infrastructure failures with the reason; the site's folder is gone afterwards."""
    task = BY_ID["gui-colour-click-red"]
    made: list[Any] = []

    def failing(config: Any, **kw: Any) -> Any:
        made.append({**kw, "served": os.path.exists(kw.get("site_socket") or "")})
        raise SandboxError("the engine is down")

    def headless(config: Any, **kw: Any) -> Any:
        made.append(_Headless(config, **kw))
        return made[-1]

    [ro] = await run_tasks(store, ForgeConfig(), [task], _StandInHarness({}), sandbox_factory=failing)
    assert (ro.status, ro.failure_kind) == ("failed", "infra") and "the engine is down" in ro.error, ro.error
    assert made[0]["served"] and made[0]["site_socket"].endswith("/site.sock")
    [ro] = await run_tasks(store, ForgeConfig(), [task], _StandInHarness({}), sandbox_factory=headless)
    assert (ro.status, ro.failure_kind) == ("failed", "infra"), ro.error
    assert "needs a sandbox with a display: the plain backend has none" in ro.error
    assert made[1].stopped and "site_socket" in made[1].kwargs
    assert sites_left() == []
    made.clear()
    [ro] = await run_tasks(store, ForgeConfig(), [BY_ID["gui-colour-click-red"].model_copy(update={"family": None})],
                           _StandInHarness({}), sandbox_factory=headless)
    assert "site_socket" not in made[0].kwargs  # a text task: no site, no socket


async def test_a_cancelled_gui_rollout_closes_its_site(store: Store) -> None:
    """Cancelled while its sandbox starts (Ctrl-C in `forge up`): the sandbox is stopped, the site closed."""
    started = asyncio.Event()

    class Hanging(_Headless):
        async def start(self) -> None:
            started.set()
            await asyncio.sleep(3600)

    made: list[Any] = []

    def hanging(config: Any, **kw: Any) -> Any:
        made.append(Hanging(config, **kw))
        return made[-1]

    job = asyncio.create_task(run_tasks(store, ForgeConfig(), [BY_ID["gui-colour-click-red"]], _StandInHarness({}),
                                        sandbox_factory=hanging))
    await asyncio.wait_for(started.wait(), 60)
    sock = made[0].kwargs["site_socket"]
    assert os.path.exists(sock)  # served while the sandbox starts
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    assert made[0].stopped and not os.path.exists(os.path.dirname(sock))
    [ro] = store.list_rollouts(store.list_runs()[0].id)
    assert ro.status == "cancelled"


def test_make_sandbox_gives_the_site_socket_to_docker_only(tmp_path: Path) -> None:
    from openforge.config import KubernetesSandboxConfig, LocalSandboxConfig
    from openforge.sandbox.factory import make_sandbox

    sock = str(tmp_path / "site.sock")
    sb = make_sandbox(DockerSandboxConfig(), run_id="r", rollout_id="a", site_socket=sock)
    assert sb.site_socket == sock  # type: ignore[attr-defined]
    assert make_sandbox(LocalSandboxConfig(), run_id="r", rollout_id="b", site_socket=sock).gui is None  # type: ignore[attr-defined]
    pytest.importorskip("kubernetes", reason="the kubernetes SDK is an optional extra")
    pod = make_sandbox(KubernetesSandboxConfig(), run_id="r", rollout_id="c", site_socket=sock)
    # A pod on another node cannot bind this host's socket: it reaches the site through the relay once
    # attach_gui names it, never through the path the sandbox was made with.
    assert sock not in repr(vars(pod))


def test_attach_gui_wants_the_socket_bound_at_creation(tmp_path: Path) -> None:
    from openforge.sandbox.docker import DockerSandbox
    from openforge.sandbox.gui import GuiSpec

    sb = DockerSandbox(DockerSandboxConfig(), run_id="r", rollout_id="a", site_socket=str(tmp_path / "site.sock"))
    sb.attach_gui(GuiSpec(url="http://127.0.0.1:8080/", site_socket=str(tmp_path / "site.sock")))
    assert sb.gui is not None
    sb.attach_gui(None)
    for other in (str(tmp_path / "other.sock"), None):
        with pytest.raises(SandboxError, match="make_sandbox\\(site_socket=...\\)"):
            sb.attach_gui(GuiSpec(url="http://127.0.0.1:8080/", site_socket=other))
    plain = DockerSandbox(DockerSandboxConfig(), run_id="r", rollout_id="b")
    with pytest.raises(SandboxError, match="created with site socket \\(none\\)"):
        plain.attach_gui(GuiSpec(site_socket=str(tmp_path / "site.sock")))


async def test_an_image_without_a_browser_is_an_infra_failure_naming_the_fix(store: Store) -> None:
    """The python sandbox image (no chromium, no Xvfb) for a GUI task: refused before the agent runs."""
    from openforge.sandbox.testing import docker_image

    tag, why = docker_image("python")
    if tag is None:
        skip_or_fail("docker", why)
    [ro] = await run_tasks(store, docker_config(tag), [BY_ID["gui-colour-click-red"]], _StandInHarness({}))
    assert (ro.status, ro.failure_kind) == ("failed", "infra"), ro.error
    assert f"image {tag} cannot run GUI tasks: no Xvfb, xdotool, chromium" in ro.error, ro.error
    assert "forge sandbox build-image --variant browser" in ro.error and "sandbox.image = " in ro.error
    assert containers_of(ro.run_id) == [] and sites_left() == []
    # the host's network would make the display's abstract socket and the site's port the host's
    [ro] = await run_tasks(store, docker_config(tag, network="host"), [BY_ID["gui-colour-click-red"]],
                           _StandInHarness({}))
    assert (ro.status, ro.failure_kind) == ("failed", "infra") and 'sandbox.network = \"none\"' in ro.error, ro.error
    assert containers_of(ro.run_id) == [] and sites_left() == []


# -- mini-gui in a container, through the real proxy ---------------------------------------------------

@pytest.mark.slow
def test_mini_gui_solves_a_builtin_web_task_in_a_container(image: str, tiny_vl_model: Path, store: Store) -> None:
    """mini-gui (the image's python3 with Debian's Pillow) in grid mode on gui-colour-click-red through the
    real proxy (its socket bound in) to a scripted engine on the tiny Qwen2-VL: `click(0)` (red's
    quadrant), `done()` scores 1; `click(1)` (another colour) scores 0. Each call has its screenshot."""
    from openforge.engine.scripted import ScriptedEngine
    from openforge.engine.serve import serve_in_thread
    from openforge.proxy.server import ProxyServer
    from openforge.sandbox.testing import proxy_socket_path

    task = BY_ID["gui-colour-click-red"]
    got = {}
    for first in ("click(0)", "click(1)"):
        engine = ScriptedEngine(tiny_vl_model, [first, "done()"])
        cfg = docker_config(image)
        cfg.harness = HarnessConfig(name="mini-gui", max_turns=3, max_tokens=8,
                                    extra_args=["--grid", "2x2", "--no-tools", "--max-side", "512"])
        cfg.proxy.max_context_tokens = 65536
        with serve_in_thread(engine.app) as eng, ProxyServer(cfg.proxy, store_path=store.path, engine_url=eng.url,
                                                              model_path=tiny_vl_model, uds=proxy_socket_path()) as proxy:
            run = store.create_run(kind="eval")
            runner = RolloutRunner(store, config=cfg, proxy_url=proxy.url, proxy_socket=proxy.uds)
            [ro] = asyncio.run(runner.run(run.id, [RolloutSpec(task)]))
        assert (ro.status, ro.harness, ro.sandbox) == ("scored", "mini-gui", "docker"), (ro.error, ro.stdout, ro.stderr)
        calls = store.list_calls(rollout_id=ro.id)
        assert len(calls) == 2 and all(c.status == "ok" and len(c.images) == 1 for c in calls)
        got[first] = ro.reward
    assert got == {"click(0)": 1.0, "click(1)": 0.0}


@pytest.mark.slow
async def test_browser_use_in_a_container_is_refused_with_the_reason(store: Store, image: str) -> None:
    """browser-use on the plain browser image (its venv is the browser-use image's:
    tests/rollouts/harnesses/test_gui_browseruse_docker.py): the rollout says so (infrastructure), never graded."""
    from openforge.rollouts.harnesses import get_harness

    cfg = docker_config(image)
    cfg.harness = HarnessConfig(name="browser-use")
    [ro] = await run_tasks(store, cfg, [BY_ID["gui-colour-click-red"]], get_harness(cfg.harness))
    assert (ro.status, ro.failure_kind, ro.reward) == ("failed", "infra", None), ro.error
    assert "browser-use is not installed in the docker sandbox image" in ro.error, ro.error
    assert "forge sandbox build-image --harness browser-use" in ro.error, ro.error
    assert sites_left() == []
