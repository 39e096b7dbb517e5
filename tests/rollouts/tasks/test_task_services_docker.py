"""Task services reached from Docker sandboxes (network none), with the real Docker engine: the same
recording front as on the host, its unix socket hard-linked into the container's exposed folder and
forwarded in each exec (sandbox/docker.py `expose_socket`), as a task's MCP tools are. One rollout's
container reaches its own services and nothing of another rollout's: not their sockets (never bound
in), not their fronts' loopback ports (the container's 127.0.0.1 is its own), and after
`withdraw_sockets` not even its own (the graders' execs)."""

from __future__ import annotations

import asyncio
import json

import pytest

from openforge.config import ForgeConfig
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.selfcheck import _StandInHarness
from openforge.rollouts.tasks.services import ServiceSession
from openforge.sandbox.docker import DockerSandbox
from openforge.sandbox.testing import backend_config
from openforge.store import Store
from tests.helpers.required import skip_or_fail
from tests.helpers.task_services import SEND, _mail, _task


@pytest.fixture(scope="module")
def docker_config():  # noqa: ANN201
    config, why = backend_config("docker", image="python")  # the agent's side posts with python3
    if config is None:
        skip_or_fail("docker", why)
    return config


# From inside a container: GET each URL given in argv; print one JSON line {url: status or error name}.
PROBE = """python3 - "$@" <<'PY'
import json, sys, urllib.error, urllib.request
seen = {}
for url in sys.argv[1:]:
    try:
        seen[url] = urllib.request.urlopen(url, timeout=3).status
    except urllib.error.HTTPError as exc:
        seen[url] = exc.code
    except Exception as exc:
        seen[url] = type(exc).__name__
print(json.dumps(seen))
PY
"""


async def _probe(sb: DockerSandbox, *urls: str) -> dict[str, object]:
    result = await sb.exec(["sh", "-c", PROBE, "sh", *urls], timeout=60)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


async def test_a_container_reaches_its_own_services_and_no_other_rollouts(docker_config) -> None:  # noqa: ANN001
    sessions = [await asyncio.to_thread(ServiceSession.open, [_mail()], seed=f"iso/{i}") for i in range(2)]
    try:
        async with DockerSandbox(docker_config, run_id="svc", rollout_id="svc-a") as mine, \
                DockerSandbox(docker_config, run_id="svc", rollout_id="svc-b") as theirs:
            env = sessions[0].expose(mine)
            sessions[1].expose(theirs)
            own = env["FORGE_SERVICE_MAIL_URL"] + "/outbox"
            other_host = sessions[1].urls()["mail"] + "/outbox"  # the other front, as the host reaches it
            seen = await _probe(mine, own, other_host)
            assert seen[own] == 200, seen
            assert seen[other_host] == "URLError", seen  # the container's loopback is not the host's
            sockets = await mine.exec("ls /run/forge-exposed", timeout=30)
            assert sockets.stdout.split() == ["8710.sock"], sockets.stdout  # its own front's socket only
            mine.withdraw_sockets()  # as before the graders' execs
            gone = await _probe(mine, own)
            assert gone[own] != 200, gone
        paths = [[(r.method, r.path, r.status) for r in s.requests()] for s in sessions]
        assert paths == [[("GET", "/outbox", 200)], []]  # the other rollout's record saw nothing
    finally:
        for session in sessions:
            session.close()


async def test_a_rollout_in_docker_is_graded_on_its_services_record(store: Store, docker_config) -> None:  # noqa: ANN001
    """The runner's whole path: services opened on the host, exposed to the container, the agent's POST
    recorded by the front, the record graded; the same agent with no call scores 0."""
    config = ForgeConfig(sandbox=docker_config)
    sent, silent = _task(), _task(id="mail-silent")
    runner = RolloutRunner(store, config=config, proxy_url="http://127.0.0.1:9",
                           harness=_StandInHarness({sent.id: SEND.replace("ATTEMPTS", "1"), silent.id: "true"}))
    run = store.create_run(kind="check", name="services-docker")
    ok, none = await runner.run(run.id, [RolloutSpec(sent), RolloutSpec(silent)])
    assert (ok.status, ok.reward, ok.sandbox) == ("scored", 1.0, "docker"), (ok.error, ok.stderr, ok.verifier_output)
    assert "mail POST /send -> 200" in ok.verifier_output
    assert (none.status, none.reward) == ("scored", 0.0), (none.error, none.verifier_output)
    assert "service requests: 0" in none.verifier_output
