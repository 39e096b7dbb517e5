"""GUI rollouts on the Kubernetes backend: the task's site stays on the host (rollouts/tasks/web/server.py),
the pod reaches it through the process's site relay (sandbox/site_relay.py) with its rollout's token,
and its execs run in a display of their own (sandbox/gui.py, written into the pod).

Against the API double (tests/k8s_double): restricted pods as bubblewrap'd process trees over the
host's /usr, so the host's chromium, Xvfb and xdotool are there, and the venv (Pillow) is shared in
read-only as the image's python3. Each pod has a network namespace of its own (`pod_network`): its
127.0.0.1:8080 and its X display are its own, and it reaches the host only at the node's address
(NODE_IP) on the relay's port, which the double carries to the relay on the host's 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import socket
import sys
import time
from pathlib import Path

import pytest
from tests.helpers.kubernetes import (  # noqa: F401 - pods, relay_port: fixtures
    DEPLOY, _cluster_config, _free_port, _gui_config, _rollouts, make_config, needs_gui, needs_pods, pods, relay_port,
)
from tests.k8s_double import IMAGE_ENV, KubeDouble
from tests.k8s_double.network import NODE_IP

import openforge.sandbox.site_relay as site_relay
from openforge.config import ForgeConfig
from openforge.errors import SandboxError
from openforge.store import Store
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import load_tasks
from openforge.rollouts.tasks.web.server import SiteSession
from openforge.rollouts.tasks.web.spec import GuiTask
from openforge.sandbox.forwarder import site_preamble
from openforge.sandbox.kubernetes import KubernetesSandbox
from openforge.sandbox.site_relay import PREAMBLE_LEN, SiteRelay, acquire_relay, release_relay

RED = next(t for t in load_tasks("builtin-web") if t.id == "gui-colour-click-red")
# The reference clicks quadrant 0 (red); the wrong one clicks quadrant 1 (green) the same way.
WRONG = (RED.solution or "").replace("click 256 192", "click 768 192")


def _http_get(host: str, port: int, preamble: bytes | None, path: str = "/", timeout: float = 20.0) -> bytes:
    """What a raw connection to the relay gets back for one HTTP GET (b"" = closed without a byte)."""
    with socket.create_connection((host, port), timeout=timeout) as conn:
        try:
            if preamble is not None:
                conn.sendall(preamble)
            conn.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        except OSError:
            return b""
        got = b""
        try:
            while chunk := conn.recv(65536):
                got += chunk
        except OSError:
            pass
        return got


# -- the relay itself -------------------------------------------------------------------------------

def test_the_relay_serves_a_token_its_own_site_and_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(site_relay, "PREAMBLE_TIMEOUT_S", 1.0)
    a = SiteSession(GuiTask(site="colour", params={"order": ["red", "green", "blue", "yellow"]},
                            expect_state={"clicks": ["red"]}))
    b = SiteSession(GuiTask(site="shop", params={"products": [{"sku": "mug-red", "name": "Red mug", "price": 6.25}]},
                            expect_state={"cart": ["mug-red"]}))
    relay = SiteRelay("127.0.0.1", 0)
    try:
        ta, tb = relay.register(a.socket_path), relay.register(b.socket_path)
        assert len(site_preamble(ta)) == PREAMBLE_LEN and ta != tb
        page_a = _http_get("127.0.0.1", relay.port, site_preamble(ta))
        page_b = _http_get("127.0.0.1", relay.port, site_preamble(tb))
        assert page_a.startswith(b"HTTP/1.0 200") or page_a.startswith(b"HTTP/1.1 200"), page_a[:200]
        assert b"/click" in page_a and b"/click" not in page_b and b"Red mug" in page_b  # each its own site
        # No token, a made-up one, one off by a digit, another case, a prefix of a good one: closed, no byte.
        forged = [None, site_preamble(secrets.token_hex(32)), site_preamble(ta[:-1] + ("0" if ta[-1] != "0" else "1")),
                  site_preamble(ta.upper()), site_preamble(ta)[:-1] + b"\r", b"FORGE-SITE " + ta.encode() + b" \n"]
        for preamble in forged:
            assert _http_get("127.0.0.1", relay.port, preamble) == b"", preamble
        # A connection that sends nothing is closed at the preamble timeout, having got nothing.
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", relay.port), timeout=20) as idle:
            assert idle.recv(10) == b""
        assert time.monotonic() - started < 15
        # A POST through the right token changes that site's state only.
        with socket.create_connection(("127.0.0.1", relay.port), timeout=20) as conn:
            conn.sendall(site_preamble(ta) + b"POST /click HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n"
                         b"Content-Type: application/x-www-form-urlencoded\r\nConnection: close\r\n\r\ncolour=red")
            assert conn.recv(100).split(b" ")[1] == b"303"
        assert a.grade()[0] and b.state() == {"cart": []}
        # Unregistering closes the token's open connection and refuses new ones.
        held = socket.create_connection(("127.0.0.1", relay.port), timeout=20)
        held.sendall(site_preamble(ta) + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        first = held.recv(65536)
        assert b"200" in first.split(b"\r\n")[0]
        relay.unregister(ta)
        deadline = time.monotonic() + 20
        rest = b"x"
        while rest and time.monotonic() < deadline:  # drain what was in flight; then EOF/reset
            try:
                rest = held.recv(65536)
            except OSError:
                rest = b""
        assert rest == b""
        held.close()
        assert _http_get("127.0.0.1", relay.port, site_preamble(ta)) == b""
        assert b"Red mug" in _http_get("127.0.0.1", relay.port, site_preamble(tb))  # B is untouched
    finally:
        relay.close()
        a.close()
        b.close()


def test_connections_owing_their_token_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod opening connections and sending nothing cannot pile them up: past MAX_UNIDENTIFIED_PER_PEER
    new ones from it are closed at once (a good token included), until the silent ones time out. And
    one site takes at most MAX_PER_TOKEN connections at once."""
    monkeypatch.setattr(site_relay, "MAX_UNIDENTIFIED_PER_PEER", 2)
    monkeypatch.setattr(site_relay, "PREAMBLE_TIMEOUT_S", 3.0)
    site = SiteSession(GuiTask(site="colour", params={}, expect_state={"clicks": ["red"]}))
    relay = SiteRelay("127.0.0.1", 0)
    try:
        token = relay.register(site.socket_path)
        silent = [socket.create_connection(("127.0.0.1", relay.port), timeout=20) for _ in range(2)]
        deadline = time.monotonic() + 20
        while relay._unidentified.get("127.0.0.1", 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _http_get("127.0.0.1", relay.port, site_preamble(token)) == b""
        for conn in silent:
            assert conn.recv(10) == b""  # closed at the preamble timeout
            conn.close()
        while relay._unidentified and time.monotonic() < deadline:
            time.sleep(0.02)
        assert b"/click" in _http_get("127.0.0.1", relay.port, site_preamble(token))
        monkeypatch.setattr(site_relay, "MAX_PER_TOKEN", 2)
        held = []
        for _ in range(2):
            held.append(socket.create_connection(("127.0.0.1", relay.port), timeout=20))
            held[-1].sendall(site_preamble(token) + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert b" 200 " in held[-1].recv(65536).split(b"\r\n")[0]  # open, kept alive
        assert _http_get("127.0.0.1", relay.port, site_preamble(token)) == b""
        held.pop().close()
        while True:  # the closed one leaves the site's count once the relay sees it
            if b"/click" in _http_get("127.0.0.1", relay.port, site_preamble(token)):
                break
            assert time.monotonic() < deadline
            time.sleep(0.05)
        held[0].close()
    finally:
        relay.close()
        site.close()


def test_one_relay_per_address_shared_and_closed_with_its_last_user() -> None:
    first = acquire_relay("127.0.0.1", 0)
    second = acquire_relay("127.0.0.1", 0)
    assert first is second and first.port
    port = first.port
    release_relay(first)
    assert _port_open(port)
    release_relay(second)
    deadline = time.monotonic() + 20
    while _port_open(port) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _port_open(port)
    with pytest.raises(SandboxError, match="site_relay_host"):
        SiteRelay("192.0.2.77", 0)  # TEST-NET-1: not an address of this machine


def test_attach_gui_says_what_to_set_when_the_relay_cannot_listen(tmp_path: Path) -> None:
    from openforge.config import KubernetesSandboxConfig

    site = SiteSession(GuiTask(site="colour", params={}, expect_state={"clicks": ["red"]}))
    try:
        for proxy_url, why in [("", "needs sandbox.proxy_url"),
                               ("http://192.0.2.77:8700", "cannot listen for the GUI site relay on 192.0.2.77")]:
            sb = KubernetesSandbox(KubernetesSandboxConfig(proxy_url=proxy_url), run_id="r", rollout_id="x")
            with pytest.raises(SandboxError, match=why) as err:
                sb.attach_gui(site.gui_spec())
            assert "\n" not in str(err.value) and sb._gui is None and sb._relay is None
        assert not site_relay._relays
    finally:
        site.close()


def _port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return True
    except OSError:
        return False


# -- in pods --------------------------------------------------------------------------------------


@needs_pods
@needs_gui
@pytest.mark.timeout(240)
async def test_gui_rollouts_in_pods_are_graded_on_the_host_state(pods: KubeDouble, tmp_path: Path, store: Store,
                                                                  relay_port: int) -> None:
    """Two GUI rollouts at once through the runner, each in its own pod with its own display, chromium
    and site: the reference solution of gui-colour-click-red clicks red (quadrant 0) and scores 1 by
    its site's state on the host; the same clicks on gui-colour-click-blue press green there and score
    0. Each site saw exactly its own pod's one click. Nothing is left: no pod, no relay."""
    config = _gui_config(pods, tmp_path, relay_port)
    blue = next(t for t in load_tasks("builtin-web") if t.id == "gui-colour-click-blue")
    good, bad = await _rollouts(store, config, [RED, blue], {RED.id: RED.solution or "", blue.id: RED.solution or ""})
    assert (good.status, good.reward) == ("scored", 1.0), (good.error, good.stderr[-2000:], good.verifier_output)
    assert 'site state: ok: {"clicks": ["red"]}' in (good.verifier_output or "")
    assert (bad.status, bad.reward) == ("scored", 0.0), (bad.error, bad.stderr[-2000:])
    assert '"clicks": ["green"]' in (bad.verifier_output or "")
    assert not pods.pods and not site_relay._relays


@needs_pods
@needs_gui
@pytest.mark.timeout(180)
async def test_a_pod_reaches_only_its_own_site(pods: KubeDouble, tmp_path: Path, relay_port: int) -> None:
    """Two rollouts attached at once, each pod with its forwarder. Pod A gets site A at 127.0.0.1:8080 and
    pod B site B; B's token is nowhere in pod A; from pod A the relay with no or a made-up token gives
    nothing, and the host's loopback is not reachable; what pod A does changes site A only; once A is
    detached the relay refuses its forwarder while B is still served."""
    config = _gui_config(pods, tmp_path, relay_port)
    site_a = SiteSession(GuiTask(site="colour", params={"order": ["red", "green", "blue", "yellow"]},
                                 expect_state={"clicks": ["red"]}))
    site_b = SiteSession(GuiTask(site="shop", params={"products": [{"sku": "mug-red", "name": "Red mug",
                                                                    "price": 6.25}]}, expect_state={"cart": ["mug-red"]}))
    a = KubernetesSandbox(config, run_id="run-gui", rollout_id="ro-a")
    b = KubernetesSandbox(config, run_id="run-gui", rollout_id="ro-b")
    fetch = "python3 -I -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:8080/', timeout=20).read())\""
    try:
        await asyncio.gather(a.start(), b.start())
        a.attach_gui(site_a.gui_spec())
        b.attach_gui(site_b.gui_spec())
        assert a._relay is b._relay and a._relay is not None and a._relay.registered == 2
        assert a._relay.port == relay_port
        token_b = b._relay_token
        probe = (
            "import socket, sys, secrets, urllib.request as u\n"
            "print('PAGE', b'/click' in u.urlopen('http://127.0.0.1:8080/', timeout=20).read())\n"
            "def raw(host, pre):\n"
            "    try:\n"
            "        s = socket.create_connection((host, int(sys.argv[1])), timeout=20)\n"
            "        s.sendall(pre + b'GET / HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n')\n"
            "    except OSError as e:\n"
            "        return type(e).__name__\n"
            "    got = b''\n"
            "    try:\n"
            "        while c := s.recv(65536): got += c\n"
            "    except OSError: pass\n"
            "    return len(got)\n"
            f"print('NONE', raw('{NODE_IP}', b''), 'MADE-UP', raw('{NODE_IP}', b'FORGE-SITE ' + secrets.token_hex(32).encode() + b'\\n'))\n"
            "print('LOOPBACK', raw('127.0.0.1', b''))\n"
            "u.urlopen(u.Request('http://127.0.0.1:8080/click', data=b'colour=red'), timeout=20).read()\n"
        )
        ra, rb = await asyncio.gather(a.exec(["python3", "-I", "-c", probe, str(relay_port)], timeout=120),
                                      b.exec(fetch, timeout=120))
        assert ra.exit_code == 0, (ra.stdout, ra.stderr[-3000:])
        assert "PAGE True" in ra.stdout and "NONE 0 MADE-UP 0" in ra.stdout, ra.stdout
        assert "LOOPBACK ConnectionRefusedError" in ra.stdout, ra.stdout  # the pod's own loopback: no relay there
        assert rb.exit_code == 0 and "Red mug" in rb.stdout and "/click" not in rb.stdout, (rb.stdout, rb.stderr[-2000:])
        assert site_a.state() == {"clicks": ["red"]} and site_b.state() == {"cart": []}
        # The pod holds its own token (the forwarder's argv: the positive control), never B's.
        # (the tokens come in on stdin: no process's argv holds them while the pod is searched)
        look = ('read a b; cat /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null | tr "\\0" "\\n" > /tmp/.seen; '
                'grep -cF -- "$a" /tmp/.seen; grep -rlF -- "$b" /tmp /home/forge /workspace | wc -l')
        r = await a.exec(look, timeout=60, stdin=f"{a._relay_token} {token_b}\n".encode())
        own, other = (int(n) for n in r.stdout.split())
        assert own >= 1 and other == 0, r.stdout
        # Detached: the token is gone from the relay, and the pod's forwarder gets nothing for it.
        a.attach_gui(None)
        assert b._relay is not None and b._relay.registered == 1
        r = await a.exec(fetch, timeout=60)
        assert r.exit_code != 0, r.stdout
        rb = await b.exec(fetch, timeout=120)
        assert rb.exit_code == 0 and "Red mug" in rb.stdout, rb.stderr[-2000:]
        assert site_a.state() == {"clicks": ["red"]}
        # Attached again with the same spec: a new token, a new forwarder (the old one's token is dead).
        spec_a = site_a.gui_spec()
        for _ in range(2):
            a.attach_gui(spec_a)
            r = await a.exec(fetch, timeout=120)
            assert r.exit_code == 0 and "/click" in r.stdout, r.stderr[-2000:]
            a.attach_gui(None)
        # Each exec's display and browser ended with it; the forwarder lives until kill_all.
        comms = "for p in /proc/[0-9]*; do cat $p/comm 2>/dev/null; done"
        before = (await a.exec(comms, timeout=30)).stdout.split()
        assert "python3" in before and not {"Xvfb", "chromium", "chrome"} & set(before), before
        await a.kill_all()
        after = (await a.exec(comms, timeout=30)).stdout.split()
        assert "python3" not in after, after
    finally:
        await asyncio.gather(a.stop(), b.stop())
        site_a.close()
        site_b.close()
    assert not site_relay._relays  # the last detach closed the relay


@needs_pods
@needs_gui
@pytest.mark.timeout(240)
def test_mini_gui_in_a_pod_through_the_proxy(tmp_path: Path, store: Store, tiny_vl_model: Path) -> None:
    """The built-in GUI harness in a pod: mini-gui (grid mode) takes a screenshot of the pod's display,
    sends it through the real proxy (reached at the node's address) to a scripted engine on the tiny
    Qwen2-VL, clicks cell 0 with xdotool in the pod and says done: gui-colour-click-red scores 1 by the
    site's state on the host; both calls recorded with their screenshot."""
    from openforge.engine.scripted import ScriptedEngine
    from openforge.engine.serve import serve_in_thread
    from openforge.config import HarnessConfig
    from openforge.proxy.server import ProxyServer

    engine = ScriptedEngine(tiny_vl_model, ["click(0)", "done()"])
    cfg = ForgeConfig()
    cfg.harness = HarnessConfig(name="mini-gui", max_turns=3, max_tokens=8,
                                extra_args=["--grid", "2x2", "--no-tools", "--max-side", "512"])
    cfg.proxy.max_context_tokens = 65536
    cfg.runner.time_limit_scale = 5.0
    relay_port = _free_port()
    venv = tuple(sorted({sys.prefix, sys.base_prefix}))
    path = f"PATH={sys.prefix}/bin:" + IMAGE_ENV[0].removeprefix("PATH=")
    with serve_in_thread(engine.app) as eng, ProxyServer(cfg.proxy, store_path=store.path, engine_url=eng.url,
                                                          model_path=tiny_vl_model) as proxy:
        proxy_port = int(proxy.url.rsplit(":", 1)[1].strip("/"))
        double = KubeDouble(tmp_path / "pods", ro_binds=venv, image_env=(path, *IMAGE_ENV[1:]), pod_network=True,
                            node_ports=(relay_port, proxy_port))
        double.start()
        try:
            cfg.sandbox = make_config(double, tmp_path, proxy_url=f"http://{NODE_IP}:{proxy_port}", start_timeout_s=60,
                                      site_relay_host="127.0.0.1", site_relay_port=relay_port)
            run = store.create_run(kind="eval")
            runner = RolloutRunner(store, config=cfg, proxy_url=proxy.url)
            [ro] = asyncio.run(runner.run(run.id, [RolloutSpec(RED)]))
        finally:
            double.stop()
    assert (ro.status, ro.reward, ro.harness) == ("scored", 1.0, "mini-gui"), (ro.error, ro.stdout, ro.stderr[-3000:])
    calls = store.list_calls(rollout_id=ro.id)
    assert len(calls) == 2 and all(len(c.images) == 1 for c in calls)
    assert 'site state: ok: {"clicks": ["red"]}' in (ro.verifier_output or "")


@needs_pods
@pytest.mark.timeout(120)
async def test_an_image_without_the_gui_tools_is_one_clear_error(tmp_path: Path) -> None:
    """An image with sh, coreutils and python3 (Pillow) but no Xvfb, xdotool or chromium: the first exec
    after attach_gui fails with one line naming what is missing and the browser image."""
    import os

    bin_dir = tmp_path / "image-bin"
    bin_dir.mkdir()
    for tool in ("sh", "timeout", "head", "cat", "tar", "env", "sleep", "grep", "mkdir", "tr"):
        os.symlink(shutil.which(tool) or f"/usr/bin/{tool}", bin_dir / tool)
    # (a script, not a symlink: the venv is found from the path python was started by)
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec {sys.prefix}/bin/python3 "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    venv = tuple(sorted({sys.prefix, sys.base_prefix, str(bin_dir)}))
    double = KubeDouble(tmp_path / "pods", ro_binds=venv, image_env=(f"PATH={bin_dir}", *IMAGE_ENV[1:]))
    double.start()
    site = SiteSession(GuiTask(site="colour", params={}, expect_state={"clicks": ["red"]}))
    sb = KubernetesSandbox(make_config(double, tmp_path, proxy_url="http://127.0.0.1:9"), run_id="run-gui",
                           rollout_id="ro-c")
    try:
        await sb.start()
        assert (await sb.exec("echo fine", timeout=30)).stdout == "fine\n"
        sb.attach_gui(site.gui_spec())
        with pytest.raises(SandboxError) as err:
            await sb.exec("true", timeout=30)
        assert "image openforge:test lacks Xvfb xdotool chromium: a GUI task needs" in str(err.value)
        assert "build-image --variant browser" in str(err.value) and "\n" not in str(err.value)
    finally:
        await sb.stop()
        site.close()
        double.stop()
    assert not site_relay._relays


# -- manifests --------------------------------------------------------------------------------------


def test_the_network_policy_opens_the_relay_port_for_a_gui_run_only() -> None:
    import yaml
    from kubernetes import client

    from openforge.errors import ConfigError
    from openforge.sandbox.k8s_manifests import sandbox_network_policy

    config = _cluster_config(site_relay_host="0.0.0.0", site_relay_port=8701)
    deployed = yaml.safe_load((DEPLOY / "sandbox-networkpolicy.yaml").read_text())
    plain = sandbox_network_policy(config.sandbox, proxy_port=config.proxy.port)
    assert plain == deployed  # the code and the applied-by-default file are the same policy
    gui = sandbox_network_policy(config.sandbox, proxy_port=config.proxy.port, gui=True)
    client.V1NetworkPolicy.model_validate(gui)
    (to_controller, dns), (plain_controller, plain_dns) = gui["spec"]["egress"], plain["spec"]["egress"]
    assert dns == plain_dns and to_controller["to"] == plain_controller["to"]  # the same peers, nothing new
    assert to_controller["ports"] == [*plain_controller["ports"], {"protocol": "TCP", "port": 8701}]
    assert gui["metadata"]["name"] == plain["metadata"]["name"]  # applying one replaces the other
    with pytest.raises(ConfigError, match="fixed sandbox.site_relay_port"):
        sandbox_network_policy(_cluster_config().sandbox, proxy_port=8700, gui=True)
    with pytest.raises(ConfigError, match="is the proxy's port"):
        sandbox_network_policy(_cluster_config(site_relay_port=8700).sandbox, proxy_port=8700, gui=True)


@pytest.mark.parametrize("version", ["1.30", "1.37"])
def test_the_gui_manifests_validate_against_the_real_schemas(version: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    from openforge.sandbox.k8s_manifests import build_pod_manifest, check_pod_manifest, pod_name, sandbox_network_policy

    config = _cluster_config(site_relay_host="0.0.0.0", site_relay_port=8701)
    pod = build_pod_manifest(config.sandbox, name=pod_name("ro-1"), run_id="run-1", rollout_id="ro-1", home="/data")
    check_pod_manifest(pod)
    for doc in (pod, sandbox_network_policy(config.sandbox, proxy_port=config.proxy.port, gui=True)):
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_network_policy_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json
    import tomllib

    import yaml

    from openforge.sandbox.k8s_manifests import main

    toml = yaml.safe_load((DEPLOY / "config.yaml").read_text())["data"]["forge.toml"]
    (tmp_path / "forge.toml").write_text(toml)
    assert main(["network-policy", "--config", str(tmp_path / "forge.toml"), "--gui"]) == 2
    assert "fixed sandbox.site_relay_port" in capsys.readouterr().err
    raw = tomllib.loads(toml)
    assert "site_relay_port" not in raw["sandbox"]
    (tmp_path / "forge.toml").write_text(toml.replace('type = "kubernetes"', 'type = "kubernetes"\n'
                                                      'site_relay_host = "0.0.0.0"\nsite_relay_port = 8701'))
    assert main(["network-policy", "--config", str(tmp_path / "forge.toml"), "--gui"]) == 0
    policy = json.loads(capsys.readouterr().out)
    assert {"protocol": "TCP", "port": 8701} in policy["spec"]["egress"][0]["ports"]
