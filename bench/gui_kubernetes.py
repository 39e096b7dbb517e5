"""What a GUI costs a Kubernetes pod exec, and what the site relay adds to a site request.

Both sides measured in the same run, medians of N:

    relay: GET / of a task site (rollouts/tasks/web/server.py) straight on its unix socket (the local
           backend's path, the baseline) vs through the site relay (TCP + the token preamble, then a
           pipe to the same socket: sandbox/site_relay.py), from the host
    pod:   in a pod of the API double (tests/k8s_double: bubblewrap over the host's /usr, so the host's
           chromium and Xvfb), sb.exec("true") plain (the baseline), the first exec after attach_gui
           (gui.py written into the pod, the forwarder started, Xvfb + chromium painted), a later exec
           in the same attach (Xvfb + chromium painted), and a `curl`-like GET of the site from inside
           the pod through its forwarder and the relay

    .venv/bin/python bench/gui_kubernetes.py [N]
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

GET = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
FETCH = ("import urllib.request as u, time\nt = time.monotonic()\nfor _ in range(20): "
         "u.urlopen('http://127.0.0.1:8080/', timeout=20).read()\nprint((time.monotonic() - t) / 20)")


def _get(family: int, address: object, preamble: bytes = b"") -> bytes:
    with socket.socket(family, socket.SOCK_STREAM) as conn:
        conn.settimeout(20)
        conn.connect(address)
        conn.sendall(preamble + GET)
        got = b""
        while chunk := conn.recv(65536):
            got += chunk
        return got


def _median_ms(fn, n: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def relay_case(n: int) -> dict:
    from openforge.rollouts.tasks.web.server import SiteSession
    from openforge.rollouts.tasks.web.spec import GuiTask
    from openforge.sandbox.forwarder import site_preamble
    from openforge.sandbox.site_relay import SiteRelay

    site = SiteSession(GuiTask(site="colour", params={}))
    relay = SiteRelay("127.0.0.1", 0)
    try:
        token = relay.register(site.socket_path)
        direct = lambda: _get(socket.AF_UNIX, site.socket_path)  # noqa: E731
        relayed = lambda: _get(socket.AF_INET, ("127.0.0.1", relay.port), site_preamble(token))  # noqa: E731
        assert direct().split(b"\r\n\r\n", 1)[1] == relayed().split(b"\r\n\r\n", 1)[1]
        a, b = [], []
        for _ in range(5):  # interleaved rounds: both sides see the same load
            a.append(_median_ms(direct, n))
            b.append(_median_ms(relayed, n))
        base, via = statistics.median(a), statistics.median(b)
        print(f"site GET /, unix socket (baseline)   median {base:7.2f} ms")
        print(f"site GET /, through the relay        median {via:7.2f} ms  ({via / base:4.1f}x, +{via - base:.2f} ms)")
        return {"unix_socket_ms": round(base, 3), "relay_ms": round(via, 3), "ratio": round(via / base, 2)}
    finally:
        relay.close()
        site.close()


async def pod_case(n: int) -> dict:
    from k8s_double import IMAGE_ENV, KubeDouble
    from k8s_double.network import NODE_IP

    from openforge.config import KubernetesSandboxConfig
    from openforge.rollouts.tasks.web.server import SiteSession
    from openforge.rollouts.tasks.web.spec import GuiTask
    from openforge.sandbox.kubernetes import KubernetesSandbox

    tmp = Path(tempfile.mkdtemp(prefix="forge-bench-k8s-gui-"))
    venv = tuple(sorted({sys.prefix, sys.base_prefix}))
    path = f"PATH={sys.prefix}/bin:" + IMAGE_ENV[0].removeprefix("PATH=")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    # Each pod in its own network namespace, reaching the relay at the node's address (as the tests).
    double = KubeDouble(tmp / "pods", ro_binds=venv, image_env=(path, *IMAGE_ENV[1:]), pod_network=True,
                        node_ports=(port,))
    double.start()
    site = SiteSession(GuiTask(site="colour", params={}))
    config = KubernetesSandboxConfig(kubeconfig=str(double.write_kubeconfig(tmp / "kubeconfig")),
                                     image="openforge:test", proxy_url=f"http://{NODE_IP}:9", start_timeout_s=60,
                                     site_relay_host="127.0.0.1", site_relay_port=port)
    times: dict[str, list[float]] = {"plain exec": [], "first exec after attach_gui": [],
                                     "later exec, same attach": []}
    fetch: list[float] = []
    try:
        async with KubernetesSandbox(config, run_id="bench", rollout_id="bench-gui") as sb:
            for _ in range(n):
                sb.attach_gui(None)
                for name in times:
                    if name == "first exec after attach_gui":
                        sb.attach_gui(site.gui_spec())
                    t = time.monotonic()
                    done = await sb.exec("true", timeout=120)
                    times[name].append(time.monotonic() - t)
                    assert done.exit_code == 0, (name, done.stderr[-2000:])
                done = await sb.exec(["python3", "-I", "-c", FETCH], timeout=120)
                assert done.exit_code == 0, done.stderr[-2000:]
                fetch.append(float(done.stdout.split()[-1]))
            sb.attach_gui(None)
    finally:
        site.close()
        double.stop()
    base = statistics.median(times["plain exec"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"pod: {name:32s} median {med * 1000:7.0f} ms  ({med / base:5.1f}x plain)  n={len(ts)}")
    print(f"pod: GET / via forwarder + relay      median {statistics.median(fetch) * 1000:7.2f} ms "
          "(urllib in the pod, 20 a run)")
    out = {name.replace(" ", "_").replace(",", ""): round(statistics.median(ts) * 1000, 1) for name, ts in times.items()}
    out["gui_exec_ratio"] = round(statistics.median(times["later exec, same attach"]) / base, 1)
    out["pod_get_ms"] = round(statistics.median(fetch) * 1000, 2)
    return out


def run(quick: bool = False) -> dict:
    """`python -m bench`'s interface (not in its default list: it needs chromium and the double's root)."""
    return {"relay": relay_case(50 if quick else 200), "pod": asyncio.run(pod_case(2 if quick else 5))}


if __name__ == "__main__":
    relay_case(200)
    asyncio.run(pod_case(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
