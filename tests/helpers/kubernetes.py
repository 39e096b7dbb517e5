"""The Kubernetes backend's tests: the API double (tests/k8s_double) as a fixture, a sandbox config that points
at it, restricted pod specs, and the GUI pods' relay."""

from __future__ import annotations

from pathlib import Path
import shutil
import socket
import sys

import pytest

from tests.k8s_double import KubeDouble, bwrap_available
from openforge.config import KubernetesSandboxConfig
from tests.helpers.paths import REPO
from tests.k8s_double import IMAGE_ENV, KubeDouble, bwrap_available
from tests.k8s_double.network import NODE_IP
from openforge.config import ForgeConfig
from openforge.store import Store
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.selfcheck import _StandInHarness
from openforge.sandbox.gui import find_chromium
from tests.helpers.required import requires


pytestmark = [
    pytest.mark.skipif(not bwrap_available(), reason="the API double runs pods under bubblewrap and nsenter as "
                                                     "root (apt-get install bubblewrap util-linux); not available here"),
    pytest.mark.timeout(60),
]


@pytest.fixture
def double(tmp_path: Path):
    d = KubeDouble(tmp_path / "pods")
    d.start()
    yield d
    d.stop()


def restricted_pod(name: str, labels: dict[str, str] | None = None, **spec) -> dict:
    """A hand-made pod that the `restricted` namespace admits."""
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": {
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "sandbox", "image": "openforge:test", "command": ["sleep", "60"], "securityContext": {
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}], **spec}}


def make_config(double: KubeDouble, tmp_path: Path, *, retries: int = 0, **k8s) -> KubernetesSandboxConfig:
    kubeconfig = double.write_kubeconfig(tmp_path / "kubeconfig")
    settings = {"kubeconfig": str(kubeconfig), "image": "openforge:test", "start_timeout_s": 10,
                "proxy_url": "http://forge-proxy.openforge:8700", **k8s}
    return KubernetesSandboxConfig(start_retries=retries, **settings)


MISSING = [n for n, ok in (("chromium", find_chromium()), ("Xvfb", shutil.which("Xvfb")),
                           ("xdotool", shutil.which("xdotool"))) if not ok]


needs_pods = pytest.mark.skipif(not bwrap_available(), reason="the API double runs pods under bubblewrap and "
                                                              "nsenter as root; not available here")


needs_gui = requires("chromium", f"needs {', '.join(MISSING)} on the host (the double's pods use the host's /usr): "
                                 "apt-get install chromium xvfb xdotool" if MISSING else None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def relay_port() -> int:
    return _free_port()


@pytest.fixture
def pods(tmp_path: Path, relay_port: int):
    venv = tuple(sorted({sys.prefix, sys.base_prefix}))
    path = f"PATH={sys.prefix}/bin:" + IMAGE_ENV[0].removeprefix("PATH=")  # the image's python3: the venv's
    double = KubeDouble(tmp_path / "pods", ro_binds=venv, image_env=(path, *IMAGE_ENV[1:]), pod_network=True,
                        node_ports=(relay_port,))
    double.start()
    yield double
    double.stop()


def _gui_config(double: KubeDouble, tmp_path: Path, relay_port: int):  # type: ignore[no-untyped-def]
    """Pods dial the node (proxy_url's host) at the relay's port; the relay listens on the host's loopback."""
    return make_config(double, tmp_path, proxy_url=f"http://{NODE_IP}:9", start_timeout_s=60,
                       site_relay_host="127.0.0.1", site_relay_port=relay_port)


async def _rollouts(store: Store, config, tasks, scripts):  # type: ignore[no-untyped-def]
    run = store.create_run(kind="check", name="gui on kubernetes")
    runner = RolloutRunner(store, config=ForgeConfig(sandbox=config), proxy_url="http://127.0.0.1:9",
                           harness=_StandInHarness(scripts))
    return await runner.run(run.id, [RolloutSpec(t) for t in tasks])


DEPLOY = REPO / "deploy" / "k8s"


def _cluster_config(**sandbox):  # type: ignore[no-untyped-def]
    """The deploy ConfigMap's forge.toml, with `sandbox` settings added."""
    import tomllib

    import yaml

    doc = yaml.safe_load((DEPLOY / "config.yaml").read_text())
    raw = tomllib.loads(doc["data"]["forge.toml"])
    raw["sandbox"].update(sandbox)
    return ForgeConfig.model_validate(raw)
