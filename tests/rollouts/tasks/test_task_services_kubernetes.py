"""A task's services and tools from Kubernetes pods (sandbox/kubernetes.py `expose_socket`): the host
servers' unix sockets registered with the process's site relay (sandbox/site_relay.py) under a token
each, and every exec run behind a forwarder (sandbox/forwarder.py --connect) on the pod's own
127.0.0.1:PORT that presents it, the way a GUI task's site reaches a pod.

Against the API double (tests/k8s_double), as tests/sandbox/test_gui_kubernetes.py: each pod has a network
namespace of its own (`pod_network`) that reaches the host only at the node's address on the relay's
port; the venv is the image's python3. What a real cluster adds (a node network, a NetworkPolicy that
must open the relay's port) is in docs/kubernetes.md."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from tests.k8s_double import KubeDouble, bwrap_available
from tests.helpers.kubernetes import _gui_config as _config, pods, relay_port  # noqa: F401 - fixtures
from tests.helpers.task_services import _mail, _task

import openforge.sandbox.site_relay as site_relay
from openforge.config import ForgeConfig
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.selfcheck import _StandInHarness
from openforge.rollouts.tasks.services import ServiceSession
from openforge.sandbox.kubernetes import KubernetesSandbox
from openforge.store import Store

pytestmark = pytest.mark.skipif(not bwrap_available(), reason="the API double runs pods under bubblewrap and "
                                                              "nsenter as root; not available here")


# In a pod: GET each URL in argv; one JSON line {url: status or the error's name}.
PROBE = ("import json, sys, urllib.error, urllib.request\nseen = {}\nfor url in sys.argv[1:]:\n"
         "    try:\n        seen[url] = urllib.request.urlopen(url, timeout=10).status\n"
         "    except urllib.error.HTTPError as exc:\n        seen[url] = exc.code\n"
         "    except Exception as exc:\n        seen[url] = type(exc).__name__\nprint(json.dumps(seen))\n")


async def _probe(sb: KubernetesSandbox, *urls: str) -> dict[str, object]:
    result = await sb.exec(["python3", "-I", "-c", PROBE, *urls], timeout=60)
    assert result.exit_code == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(180)
async def test_a_pod_reaches_its_own_services_and_no_other_rollouts(pods: KubeDouble, tmp_path: Path,
                                                                     relay_port: int) -> None:
    config = _config(pods, tmp_path, relay_port)
    sessions = [await asyncio.to_thread(ServiceSession.open, [_mail()], seed=f"k8s/{i}") for i in range(2)]
    a = KubernetesSandbox(config, run_id="run-svc", rollout_id="ro-a")
    b = KubernetesSandbox(config, run_id="run-svc", rollout_id="ro-b")
    try:
        await asyncio.gather(a.start(), b.start())
        own = sessions[0].expose(a)["FORGE_SERVICE_MAIL_URL"] + "/outbox"
        sessions[1].expose(b)
        assert own == "http://127.0.0.1:8710/outbox"
        other_host = sessions[1].urls()["mail"] + "/outbox"  # B's front as the host reaches it
        seen = await _probe(a, own, other_host)
        assert seen[own] == 200, seen
        assert seen[other_host] == "URLError", seen  # the pod's loopback is its own
        relay = site_relay._relays  # one relay for the process, each front under a token of its own
        assert len(relay) == 1 and next(iter(relay.values())).registered == 2
        a.withdraw_sockets()  # as before the graders' execs: the token is gone, so is the door
        gone = await _probe(a, own)
        assert gone[own] != 200, gone
        assert [[(r.method, r.path, r.status) for r in s.requests()] for s in sessions] == [
            [("GET", "/outbox", 200)], []]
    finally:
        await asyncio.gather(a.stop(), b.stop())
        for session in sessions:
            session.close()
    assert not site_relay._relays  # the last withdraw closed the relay


# The agent: one task tool over MCP (the host's server sends it on to the service), then the service
# itself at the URL it was given. Stdlib only, as mini's McpTools (rollouts/harnesses/mini_agent.py).
AGENT = r"""python3 -I - <<'PY'
import json, os, urllib.request
url, token, session = os.environ["FORGE_MCP_URL"], os.environ["FORGE_MCP_TOKEN"], None
def post(i, method, params=None):
    global session
    msg = {"jsonrpc": "2.0", "method": method, **({"id": i} if i else {}), **({"params": params} if params else {})}
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "Authorization": "Bearer " + token}
    if session:
        headers |= {"Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-06-18"}
    with urllib.request.urlopen(urllib.request.Request(url, json.dumps(msg).encode(), headers), timeout=30) as r:
        session = r.headers.get("Mcp-Session-Id") or session
        return r.read().decode()
post(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}})
post(0, "notifications/initialized")
print("TOOL", post(2, "tools/call", {"name": "send_mail", "arguments": {"to": "bob@example.org"}}))
print("OUTBOX", urllib.request.urlopen(os.environ["FORGE_SERVICE_MAIL_URL"] + "/outbox", timeout=30).read().decode())
PY
"""


@pytest.mark.timeout(180)
async def test_a_rollout_in_a_pod_uses_its_tools_and_services_and_is_graded(pods: KubeDouble, tmp_path: Path,
                                                                           relay_port: int, store: Store) -> None:
    task = _task(id="mail-k8s", tools=[{"name": "send_mail", "description": "Send an email", "service": "mail",
                                        "path": "/send"}],
                 expect_requests=[{"service": "mail", "path": "/send", "tool": "send_mail",
                                   "body": {"to": "bob@example.org"}},
                                  {"service": "mail", "method": "GET", "path": "/outbox"}])
    runner = RolloutRunner(store, config=ForgeConfig(sandbox=_config(pods, tmp_path, relay_port)),
                           proxy_url="http://127.0.0.1:9", harness=_StandInHarness({task.id: AGENT}))
    run = store.create_run(kind="check", name="services-k8s")
    [ro] = await runner.run(run.id, [RolloutSpec(task)])
    assert (ro.status, ro.reward, ro.sandbox) == ("scored", 1.0, "kubernetes"), (ro.error, ro.stderr[-3000:],
                                                                               ro.verifier_output)
    assert '\\"id\\": 1' in ro.stdout and '"isError":false' in ro.stdout, ro.stdout  # the tool's result
    assert 'OUTBOX {"messages": [{"to": "bob@example.org"}]}' in ro.stdout, ro.stdout  # the service, directly
    assert "mail POST /send -> 200 tool send_mail" in ro.verifier_output, ro.verifier_output
    assert not site_relay._relays
