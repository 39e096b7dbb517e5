"""A Harbor task's compose services on the Kubernetes backend: each a container of the rollout's pod
(sandbox/k8s_manifests.py `_add_services`), its name a host alias of 127.0.0.1.

The manifests against the client's model and the real schemas (kubernetes-validate); a start, exec and stop
through the API double (tests/k8s_double: every pod in a network namespace of its own, its containers in
their own mount and PID namespaces, the kubelet's /etc/hosts with the spec's hostAliases); the refusals."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import psutil
import pytest
from tests.k8s_double import KubeDouble, bwrap_available
from tests.k8s_double.admission import admit_pod, pod_security_violations
from tests.k8s_double.pods import IMAGE_ENV
from kubernetes.client import V1Pod
from tests.helpers.kubernetes import make_config

from openforge.config import ForgeConfig, KubernetesSandboxConfig
from openforge.errors import SandboxError
from openforge.sandbox.compose import DROPPED_CAPABILITIES
from openforge.sandbox.k8s_manifests import build_pod_manifest, check_pod_manifest, pod_name
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import TaskSpec
from openforge.rollouts.tasks.selfcheck import _StandInHarness
from openforge.sandbox.kubernetes import KubernetesSandbox
from openforge.store import Store

needs_pods = pytest.mark.skipif(not bwrap_available(), reason="the API double runs pods under bubblewrap and "
                                                              "nsenter as root; not available here")
DB = {"name": "db", "image": "postgres:16", "environment": {"POSTGRES_PASSWORD": "pw"}}
API = {"name": "api", "image": "my-api:1", "command": "serve --port '8000'"}


def _manifest(services: list[dict], **k8s) -> dict:
    config = KubernetesSandbox.with_services(KubernetesSandboxConfig(workdir="/app", **k8s), services)
    return build_pod_manifest(config, name=pod_name("ro-1"), run_id="run-1", rollout_id="ro-1", home="/data")


def test_each_service_is_a_hardened_container_of_the_pod() -> None:
    m = _manifest([DB, API], cpu_limit="3", memory_request="1Gi", memory_limit="4Gi")
    check_pod_manifest(m)
    V1Pod.model_validate(m)
    spec = m["spec"]
    agent, db, api = spec["containers"]
    assert [c["name"] for c in spec["containers"]] == ["sandbox", "svc-db", "svc-api"]
    assert spec["hostAliases"] == [{"ip": "127.0.0.1", "hostnames": ["db", "api"]}]
    assert "shareProcessNamespace" not in spec  # the agent sees none of a service's processes
    # The image's user, entrypoint and working directory; compose's command replaces only the image's CMD.
    assert "command" not in db and "args" not in db and "workingDir" not in db
    assert api["args"] == ["serve", "--port", "8000"] and "command" not in api
    assert db["env"] == [{"name": "POSTGRES_PASSWORD", "value": "pw"}] and api["env"] == []
    for svc in (db, api):
        assert "volumeMounts" not in svc  # none of the agent's files
        assert svc["resources"] == agent["resources"]
        assert svc["securityContext"] == {"allowPrivilegeEscalation": False, "privileged": False,
                                          "capabilities": {"drop": DROPPED_CAPABILITIES}}
    # The pod's user moved onto the agent's container: it still runs as forge's non-root user.
    assert not {"runAsUser", "runAsNonRoot", "runAsGroup"} & set(spec["securityContext"])
    assert {k: agent["securityContext"][k] for k in ("runAsNonRoot", "runAsUser", "runAsGroup")} == \
        {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000}
    # `baseline` admits it; `restricted` refuses the services' containers only.
    assert admit_pod(m) == [] and pod_security_violations(m, "baseline") == []
    assert all('"sandbox"' not in v and '"svc-db"' in v for v in pod_security_violations(m, "restricted"))
    # Without services the pod is as before: restricted, its user on the pod.
    plain = build_pod_manifest(KubernetesSandboxConfig(workdir="/app"), name="p", run_id="r", rollout_id="r")
    assert plain["spec"]["securityContext"]["runAsUser"] == 1000 and "hostAliases" not in plain["spec"]
    assert pod_security_violations(plain, "restricted") == []


@pytest.mark.parametrize("version", ["1.30", "1.37"])
def test_the_manifest_validates_against_the_real_schemas(version: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    cache = {"name": "cache", "image": "redis:7", "command": ["redis-server"]}
    kubernetes_validate.validate(_manifest([DB, API, cache]), version, strict=True)


@pytest.mark.parametrize("name", ["my_db", "db.internal", "x" * 60])
def test_a_name_that_is_no_container_name_is_refused(name: str) -> None:
    with pytest.raises(SandboxError, match=rf"compose service {name}: on the kubernetes backend a service's name is "
                                           "a container name and a host alias"):
        KubernetesSandbox.with_services(KubernetesSandboxConfig(), [DB, {**DB, "name": name}])
    assert KubernetesSandbox.with_services(KubernetesSandboxConfig(), [{**DB, "name": "x" * 59}]).compose_services


# -- through the API double -----------------------------------------------------------------------------------
# A service that serves its TOKEN at :8000 from a folder of its own filesystem.
SERVE = ["sh", "-c", "mkdir -p /srv && echo $TOKEN > /srv/token && exec python3 -m http.server 8000 --bind "
                     "127.0.0.1 --directory /srv"]
# Running is not listening yet (on Docker neither): the probe waits for the server, as a task's tests do.
PROBE = ("import sys, time, urllib.request\nfor _ in range(300):\n    try:\n"
         "        print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode().strip()); break\n"
         "    except OSError:\n        time.sleep(0.1)\n")


@pytest.fixture
def pods(tmp_path: Path):
    venv = tuple(sorted({sys.prefix, sys.base_prefix}))
    path = f"PATH={sys.prefix}/bin:" + IMAGE_ENV[0].removeprefix("PATH=")  # the image's python3: the venv's
    double = KubeDouble(tmp_path / "pods", ro_binds=venv, image_env=(path, *IMAGE_ENV[1:]), pod_network=True,
                        images={"openforge:test", "svc:1"}, pod_security={"openforge": "baseline"})
    double.start()
    yield double
    double.stop()


def _with_db(double: KubeDouble, tmp_path: Path, token: str, **service) -> KubernetesSandboxConfig:
    db = {"name": "db", "image": "svc:1", "environment": {"TOKEN": token}, "command": SERVE, **service}
    return KubernetesSandbox.with_services(make_config(double, tmp_path, start_timeout_s=60), [db])


@needs_pods
@pytest.mark.timeout(180)
async def test_each_rollout_reaches_its_own_service_by_name(pods: KubeDouble, tmp_path: Path) -> None:
    a = KubernetesSandbox(_with_db(pods, tmp_path, "token-a"), run_id="run-c", rollout_id="ro-a")
    b = KubernetesSandbox(_with_db(pods, tmp_path, "token-b"), run_id="run-c", rollout_id="ro-b")
    try:
        await asyncio.gather(a.start(), b.start())
        for sb, token in ((a, "token-a"), (b, "token-b")):  # the same name and port, each pod's own
            got = await sb.exec(["python3", "-I", "-c", PROBE, "http://db:8000/token"], timeout=60)
            assert (got.exit_code, got.stdout.strip()) == (0, token), got.stderr[-2000:]
        # The service's files and processes are not the agent's to see.
        seen = await a.exec("ls /srv 2>&1; grep -l 'http[.]server' /proc/[0-9]*/cmdline 2>/dev/null | wc -l", timeout=30)
        assert "No such file or directory" in seen.stdout and seen.stdout.split()[-1] == "0"
        # kill_all ends what the agent started, never a service: it is there for the verifier.
        await a.kill_all()
        got = await a.exec(["python3", "-I", "-c", PROBE, "http://db:8000/token"], timeout=60)
        assert got.stdout.strip() == "token-a"
        pod = pods.pods[("openforge", a.name)]
        served = pod.sidecars["svc-db"].main.pid
        assert psutil.pid_exists(served)
    finally:
        await asyncio.gather(a.stop(), b.stop())
    # forge's execs all went to the agent's container, never a service's.
    execs = [q for method, path, q in pods.requests if path.endswith("/exec")]
    assert execs and {q.get("container") for q in execs} == {"sandbox"}
    assert not pods.pods and _gone(served)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@needs_pods
@pytest.mark.timeout(120)
@pytest.mark.parametrize("service, why", [
    ({"command": ["sh", "-c", "echo no database; exit 3"]},
     "container svc-db Error (exit code 3); svc-db's last output: no database"),
    ({"image": "missing:1"}, "container svc-db: ErrImagePull"),
])
async def test_a_service_that_cannot_run_fails_the_start_naming_it(pods: KubeDouble, tmp_path: Path, service: dict,
                                                                   why: str) -> None:
    sb = KubernetesSandbox(_with_db(pods, tmp_path, "t", **service), run_id="run-c", rollout_id="ro-bad")
    with pytest.raises(SandboxError, match=re.escape(why)):
        await sb.start()
    assert not pods.pods


@needs_pods
@pytest.mark.timeout(60)
async def test_a_restricted_namespace_refuses_services_saying_what_they_need(tmp_path: Path) -> None:
    double = KubeDouble(tmp_path / "pods", images={"openforge:test", "svc:1"})  # openforge is `restricted`
    double.start()
    try:
        sb = KubernetesSandbox(_with_db(double, tmp_path, "t"), run_id="run-c", rollout_id="ro-r")
        with pytest.raises(SandboxError, match=r'violates PodSecurity "restricted:latest".*need a namespace whose '
                                               r"Pod Security level is `baseline`"):
            await sb.start()
    finally:
        double.stop()


# The service counts the GET / it answers; the verifier, run after the agent is gone, asks it.
COUNTER = ("import http.server, os\nhits = 0\nclass H(http.server.BaseHTTPRequestHandler):\n"
           "    def do_GET(self):\n        global hits\n        hits += self.path == '/'\n"
           "        body = (os.environ['VALUE'] if self.path == '/' else str(hits)).encode()\n"
           "        self.send_response(200); self.end_headers(); self.wfile.write(body)\n"
           "http.server.ThreadingHTTPServer(('', 8000), H).serve_forever()\n")
FETCH = ("python3 -I -c \"import time, urllib.request\nfor _ in range(300):\n    try:\n"
         "        open('answer.txt', 'w').write(urllib.request.urlopen('http://svc:8000/', timeout=5).read().decode())"
         "; break\n    except OSError:\n        time.sleep(0.1)\n\"")
CHECK = ("python3 -I -c \"import sys, urllib.request\nhits = urllib.request.urlopen('http://svc:8000/hits').read()\n"
         "print('hits', hits.decode()); sys.exit(not (open('answer.txt').read() == 'v-42' and hits == b'1'))\"")


@needs_pods
@pytest.mark.timeout(180)
async def test_a_compose_task_runs_and_is_graded_through_the_runner(pods: KubeDouble, tmp_path: Path,
                                                                    store: Store) -> None:
    """The path a user's run takes: TaskSpec.compose -> the runner's with_services -> the pod; the verifier
    reads the service's state after the agent, and an idle agent's own service was never asked."""
    svc = {"name": "svc", "image": "svc:1", "environment": {"VALUE": "v-42"}, "command": ["python3", "-c", COUNTER]}
    tasks = [TaskSpec(id=i, instruction="Write what http://svc:8000/ says to answer.txt.", verifier=CHECK,
                      compose=[svc]) for i in ("solves", "idle")]
    runner = RolloutRunner(store, config=ForgeConfig(sandbox=make_config(pods, tmp_path, start_timeout_s=60)),
                           proxy_url="http://127.0.0.1:9", harness=_StandInHarness({"solves": FETCH, "idle": "true"}))
    run = store.create_run(kind="check", name="compose-k8s")
    out = {ro.task_id: ro for ro in await runner.run(run.id, [RolloutSpec(t) for t in tasks])}
    assert {k: (ro.status, ro.reward, ro.sandbox) for k, ro in out.items()} == {
        "solves": ("scored", 1.0, "kubernetes"), "idle": ("scored", 0.0, "kubernetes")}, \
        {k: (ro.error, ro.verifier_output) for k, ro in out.items()}
    assert "hits 1" in out["solves"].verifier_output and "hits 0" in out["idle"].verifier_output
    assert not pods.pods
