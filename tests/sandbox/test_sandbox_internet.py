"""`sandbox.allow_internet` per backend, as far as this machine can show it (it has no internet): a
sandbox without it has no network interface but loopback; a Docker sandbox with it gets an interface
and a default route on forge's egress bridge (inter-container traffic off); a local sandbox refuses
it (bubblewrap has no network between none and the host's). Kubernetes' variant is its NetworkPolicy
(tests/rollouts/tasks/web/test_tasks_web_benchmarks.py). Whether a page on the live web loads is untested here."""

from __future__ import annotations

import os

import pytest

from openforge.config import DockerSandboxConfig, ForgeConfig, LocalSandboxConfig, SandboxConfig
from openforge.sandbox import make_sandbox
from openforge.sandbox.base import IsolationUnavailable
from openforge.sandbox.factory import isolation_check
from openforge.sandbox.testing import backend_config
from tests.helpers.required import skip_or_fail

pytestmark = pytest.mark.timeout(120)
# /proc/net is the exec's own network namespace: its interfaces, then its routes' destinations (hex)
INTERFACES = ("awk 'NR > 2 {sub(\":\", \"\", $1); print $1}' /proc/net/dev; echo routes; "
              "awk 'NR > 1 {print $2}' /proc/net/route")


async def _network(config: SandboxConfig, name: str) -> tuple[list[str], list[str]]:
    """(the sandbox's network interfaces, its routes' destinations in hex) as an exec inside sees them."""
    async with make_sandbox(config, run_id="run-test", rollout_id=f"ro-net-{name}-{os.getpid()}") as sb:
        done = await sb.exec(INTERFACES, timeout=30)
    assert done.exit_code == 0, done.stderr
    interfaces, _, routes = done.stdout.partition("routes")
    return interfaces.split(), routes.split()


async def test_a_local_sandbox_has_loopback_only_and_refuses_the_internet() -> None:
    config, why = backend_config("local-bwrap")
    if config is None:
        pytest.skip(why)
    assert await _network(config, "local") == (["lo"], [])
    with pytest.raises(IsolationUnavailable, match="a local sandbox cannot open the internet"):
        isolation_check(LocalSandboxConfig(isolation="bwrap", allow_internet=True))
    from openforge.runs.prepare import isolation_for  # a run is refused at preflight, one line

    with pytest.raises(IsolationUnavailable):
        isolation_for(ForgeConfig(sandbox=LocalSandboxConfig(allow_internet=True)))


async def test_docker_opens_a_network_of_its_own_only_with_allow_internet() -> None:
    config, why = backend_config("docker")
    if config is None:
        skip_or_fail("docker", why)
    assert isinstance(config, DockerSandboxConfig)
    from openforge.sandbox.docker import EGRESS_NETWORK
    from openforge.sandbox.docker_engine import connect

    assert await _network(config, "off") == (["lo"], [])
    online = config.model_copy(update={"allow_internet": True})
    interfaces, routes = await _network(online, "on")
    assert "lo" in interfaces and len(interfaces) == 2 and "00000000" in routes  # an interface and a default route
    assert isolation_check(online).detail == f"containers with network {EGRESS_NETWORK!r}"
    client = connect(timeout=10)
    try:
        [network] = [n for n in client.networks.list(names=[EGRESS_NETWORK]) if n.name == EGRESS_NETWORK]
        assert network.attrs["Driver"] == "bridge"
        assert network.attrs["Options"]["com.docker.network.bridge.enable_icc"] == "false"
    finally:
        client.close()
