"""A Harbor task's docker-compose.yaml services beside `main` (rollouts/tasks/harbor/compose.py), run on the
Docker backend per rollout (sandbox/compose.py): the agent reaches its own rollout's service by name, the
task's test.sh queries that service after the agent, another rollout's service and the host stay out of
reach, and the services and their network are gone with the rollout (and by `forge gc`). What
forge does not run of a compose file is one line each; the local and Kubernetes backends refuse the task."""

from __future__ import annotations

import asyncio
import http.server
import threading
import textwrap
from pathlib import Path

import pytest

from openforge.config import DockerSandboxConfig, ForgeConfig, KubernetesSandboxConfig, LocalSandboxConfig
from openforge.errors import SandboxError
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import TaskSpec, load_tasks, validate_tasks
from openforge.rollouts.tasks.harbor.image import import_harbor
from openforge.rollouts.tasks.selfcheck import _StandInHarness
from openforge.sandbox.compose import network_name
from openforge.sandbox.docker import DockerSandbox
from openforge.sandbox.gc import collect_docker
from openforge.sandbox.kubernetes import KubernetesSandbox
from openforge.sandbox.local import LocalSandbox
from openforge.sandbox.testing import backend_config
from openforge.store import Store
from tests.helpers.required import skip_or_fail
from tests.helpers.harbor import _task

# The service: a value made when it starts (so only a request to this very container learns it), the
# number of times it was asked, and /peek for the tests (which does not count).
SERVER = """\
import http.server, os, secrets
VALUE = os.environ["PREFIX"] + secrets.token_hex(6)
hits = 0
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global hits
        hits += self.path == "/"
        body = {"/": VALUE, "/peek": VALUE, "/hits": str(hits)}.get(self.path, "").encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
http.server.ThreadingHTTPServer(("", 8000), Handler).serve_forever()
"""
FETCH = """python3 - <<'PY'
import time, urllib.request
for _ in range(120):  # the service may still be binding its port
    try:
        value = urllib.request.urlopen("http://svc:8000/", timeout=5).read().decode()
        break
    except OSError:
        time.sleep(0.5)
open("answer.txt", "w").write(value)
PY
"""
TEST_SH = """python3 - <<'PY'
import urllib.request
get = lambda p: urllib.request.urlopen("http://svc:8000" + p, timeout=10).read().decode()
value, hits = get("/peek"), int(get("/hits"))
try:
    answer = open("/app/answer.txt").read().strip()
except OSError:
    answer = ""
print(f"hits={hits}")
open("/logs/verifier/reward.txt", "w").write("1" if answer == value and value.startswith("v-") and hits >= 1 else "0")
PY
"""


def _compose_task(root: Path, base: str) -> Path:
    folder = _task(root, "svc-task", toml="[verifier]\ntimeout_sec = 60\n[agent]\ntimeout_sec = 120\n",
                   dockerfile="FROM ubuntu:24.04\nWORKDIR /app\n", test_sh=TEST_SH,
                   instruction="Fetch the value the service at http://svc:8000/ gives; write it to /app/answer.txt.")
    env = folder / "environment"
    (env / "svc").mkdir()
    (env / "svc" / "server.py").write_text(SERVER)
    (env / "svc" / "Dockerfile").write_text(f"FROM {base}\nCOPY server.py /srv/server.py\n")
    (env / "docker-compose.yaml").write_text(textwrap.dedent("""\
        services:
          main: {}
          svc:
            build: ./svc
            environment: ["PREFIX=v-"]
            command: ["python3", "/srv/server.py"]
        """))
    (folder / "solution").mkdir()
    (folder / "solution" / "solve.sh").write_text("#!/bin/bash\n" + FETCH)
    return folder


def test_what_forge_cannot_run_of_a_compose_file_is_one_line_each(tmp_path: Path) -> None:
    root = tmp_path / "set"
    cases = {
        "ports": "services:\n  db:\n    image: postgres:16\n    ports: ['5432:5432']\n",
        "host-env": "services:\n  db:\n    image: postgres:16\n    environment: [PGPASSWORD]\n",
        "main-set": "services:\n  main:\n    network_mode: host\n",
        "builds": "services:\n  api:\n    build: ./api\n",
        "no-image": "services:\n  api:\n    command: serve\n",
        "fine": "services:\n  db:\n    image: postgres:16\n    environment: {POSTGRES_PASSWORD: x, DEBUG: true}\n",
    }
    for name, text in cases.items():
        folder = _task(root, name, test_sh="echo 1 > /logs/verifier/reward.txt\n")
        (folder / "environment" / "docker-compose.yaml").write_text(text)
    (root / "builds" / "environment" / "api").mkdir()
    (root / "builds" / "environment" / "api" / "Dockerfile").write_text("FROM busybox\n")
    problems = {p.task_id: p.message for p in validate_tasks(root)}
    assert problems.keys() == cases.keys() - {"fine"}
    assert problems["ports"].endswith("service db sets ports: forge runs a service from only its image, build, "
                                      "environment, command")
    assert "environment PGPASSWORD takes its value from the host's environment" in problems["host-env"]
    assert "service main sets network_mode" in problems["main-set"]
    assert "service api has a build: `forge tasks import harbor SRC --out DIR` builds it" in problems["builds"]
    assert "service api: no image or build" in problems["no-image"]
    assert all("\n" not in m for m in problems.values())
    fine = _load(root / "fine")
    assert [s.model_dump() for s in fine.compose] == [
        {"name": "db", "image": "postgres:16", "command": None,
         "environment": {"POSTGRES_PASSWORD": "x", "DEBUG": "true"}}]


def _load(folder: Path) -> TaskSpec:
    [task] = load_tasks(folder)
    return task


def test_local_refuses_a_task_with_compose_services_in_one_line() -> None:
    services = [{"name": "db", "image": "postgres:16"}]
    with pytest.raises(SandboxError) as err:
        LocalSandbox.with_services(LocalSandboxConfig(), services)
    assert "compose services beside the agent (db)" in str(err.value) and "\n" not in str(err.value)
    # Kubernetes runs them as containers of the rollout's pod (tests/sandbox/test_kubernetes_compose.py).
    assert KubernetesSandbox.with_services(KubernetesSandboxConfig(), services).compose_services[0]["name"] == "db"
    assert DockerSandbox.with_services(DockerSandboxConfig(), services).compose_services[0]["name"] == "db"
    with pytest.raises(SandboxError, match='sandbox.network = "none"'):
        DockerSandbox.with_services(DockerSandboxConfig(network="host"), services)


async def test_a_compose_task_on_a_local_sandbox_fails_as_infrastructure_saying_why(store: Store) -> None:
    task = TaskSpec(id="svc", instruction="x", expect_answer={"text": "y"}, compose=[{"name": "db", "image": "postgres:16"}])
    run = store.create_run(kind="check")
    runner = RolloutRunner(store, config=ForgeConfig(sandbox=LocalSandboxConfig(isolation="none")),
                           proxy_url="http://127.0.0.1:9", harness=_StandInHarness({"svc": "true"}))
    [ro] = await runner.run(run.id, [RolloutSpec(task)])
    assert (ro.status, ro.reward) == ("failed", None) and ro.error.startswith("infra: "), ro.error
    assert "the local backend cannot run them" in ro.error and "\n" not in ro.error


def _docker(label: str = "python") -> DockerSandboxConfig:
    config, why = backend_config("docker", image=label)
    if config is None:
        skip_or_fail("docker", why)
    assert isinstance(config, DockerSandboxConfig)
    return config


async def test_the_reference_reaches_its_own_service_and_the_tests_query_it_after(store: Store, tmp_path: Path
                                                                                   ) -> None:
    """Imported (the service's `build` built offline), then the reference and an idle agent at once: each
    rollout's test.sh asks its own service how often it was asked."""
    config = _docker()
    report = import_harbor(_compose_task(tmp_path / "set", config.image))
    assert report.refused == [] and len(report.built + report.cached) == 1, report
    task = TaskSpec.model_validate(report.tasks[0])
    assert [s.name for s in task.compose] == ["svc"] and task.compose[0].image.startswith("openforge-harbor:")
    tasks = [task.model_copy(update={"id": label}) for label in ("solves", "idle")]
    run = store.create_run(kind="check")
    # "solves" runs the task's own solution/solve.sh, as the reference run of `forge tasks validate --run` does
    harness = _StandInHarness({"solves": task.solution, "idle": "true"}, solutions={"solves": tasks[0]})
    runner = RolloutRunner(store, config=ForgeConfig(sandbox=config), proxy_url="http://127.0.0.1:9",
                           harness=harness)
    out = {ro.task_id: ro for ro in await runner.run(run.id, [RolloutSpec(t) for t in tasks])}
    got = {k: (ro.status, ro.reward) for k, ro in out.items()}
    assert got == {"solves": ("scored", 1.0), "idle": ("scored", 0.0)}, {k: (ro.error, ro.verifier_output)
                                                                         for k, ro in out.items()}
    assert "hits=1" in out["solves"].verifier_output and "hits=0" in out["idle"].verifier_output
    _assert_gone(config, run.id)


def _assert_gone(config: DockerSandboxConfig, run_id: str) -> None:
    from openforge.sandbox.docker_engine import connect

    client = connect(config.base_url, timeout=30)
    try:
        left = client.containers.list(all=True, filters={"label": f"openforge.run={run_id}"})
        nets = client.networks.list(filters={"label": f"openforge.run={run_id}"})
        assert (left, nets) == ([], [])
    finally:
        client.close()


async def test_a_rollout_reaches_neither_another_rollouts_services_nor_the_host(forge_home: Path) -> None:
    config = _docker()
    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    services = [{"name": "svc", "image": config.image, "command": ["python3", "-c", SERVER],
                 "environment": {"PREFIX": "v-"}}]
    with_services = DockerSandbox.with_services(config, services)
    a = DockerSandbox(with_services, run_id="c31", rollout_id="c31-a")
    b = DockerSandbox(with_services, run_id="c31", rollout_id="c31-b")
    try:
        await asyncio.gather(a.start(), b.start())
        net = a._client.networks.get(network_name("c31-a"))
        svc_ip = a._client.api.inspect_container("openforge-c31-a-svc")["NetworkSettings"]["Networks"][
            network_name("c31-a")]["IPAddress"]
        gateway = net.attrs["IPAM"]["Config"][0]["Gateway"]
        host = a._client.api.inspect_container("openforge-c31-a-svc")["HostConfig"]
        assert (host["Memory"], host["PidsLimit"]) == (config.memory_mb << 20, config.pids_limit)  # the agent's
        assert host["SecurityOpt"] == ["no-new-privileges"] and "NET_RAW" in host["CapDrop"]
        probe = textwrap.dedent("""\
            import sys, time, urllib.request
            for url in sys.argv[1:]:
                for _ in range(40 if "//svc:" in url else 1):  # its own service may still be binding its port
                    try:
                        print(url, "ok", urllib.request.urlopen(url, timeout=3).read().decode()[:8])
                        break
                    except Exception as exc:
                        err = type(exc).__name__
                        time.sleep(0.5)
                else:
                    print(url, "no", err)
            """)
        own = await a.exec(["python3", "-c", probe, "http://svc:8000/peek"], timeout=60)
        assert "http://svc:8000/peek ok v-" in own.stdout, own
        port = server.server_address[1]
        other = await b.exec(["python3", "-c", probe, f"http://{svc_ip}:8000/peek", "http://openforge-c31-a-svc:8000/",
                              f"http://{gateway}:{port}/"], timeout=60)
        assert " ok " not in other.stdout and other.stdout.count(" no ") >= 3, other
        await a.stop()
        found = collect_docker(config, home=forge_home, run_id="c31", is_live=lambda run: False)
        assert {x.ident for x in found} == {"openforge-c31-b", "openforge-c31-b-svc", network_name("c31-b")}
        _assert_gone(config, "c31")
    finally:
        server.shutdown()
        for sb in (a, b):
            await sb.stop()
