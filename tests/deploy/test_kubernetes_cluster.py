"""deploy/k8s/cluster: the GPU layout (SGLang workers, SGLang's router, the trainer as an indexed Job
under torchrun) validates against the API server's real schemas and agrees with forge's own code:
the worker command is forge's SGLang launch, the router's flags parse with sglang-router's own
parser, the torchrun flags with torch's, and the Job's ranks match trainer.nproc."""

from __future__ import annotations

import copy
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.helpers.paths import REPO
from openforge.engine.sglang import sglang_command
from openforge.config import ForgeConfig, SglangEngineConfig

CLUSTER = REPO / "deploy" / "k8s" / "cluster"
BASE = CLUSTER.parent


def _docs(folder: Path, skip: set[str]) -> dict[tuple[str, str], dict]:
    found = {}
    for path in sorted(folder.glob("*.yaml")):
        if path.name in skip:
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            found[(doc["kind"], doc["metadata"]["name"])] = doc
    return found


def _merge(base: dict, patch: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in patch.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


@pytest.fixture(scope="module")
def rendered() -> dict[tuple[str, str], dict]:
    """What `kubectl apply -k deploy/k8s/cluster` applies: the base, the new objects, the patch."""
    kustomization = yaml.safe_load((CLUSTER / "kustomization.yaml").read_text())
    assert kustomization["resources"][0] == "../"
    on_disk = {p.name for p in CLUSTER.glob("*.yaml")} - {"kustomization.yaml"}
    patches = {p["path"] for p in kustomization["patches"]}
    assert set(kustomization["resources"][1:]) | patches == on_disk  # every file is applied
    objs = _docs(BASE, {"kustomization.yaml"})
    new = _docs(CLUSTER, {"kustomization.yaml"} | patches)
    assert not set(new) & set(objs)  # the layout adds objects, it replaces none of the base's
    objs.update(new)
    for path in patches:
        patch = yaml.safe_load((CLUSTER / path).read_text())
        key = (patch["kind"], patch["metadata"]["name"])
        assert key in objs, f"{path} patches {key}, which the base does not have"
        objs[key] = _merge(objs[key], patch)
    return objs


@pytest.mark.parametrize("version", ["1.30", "1.37"])
def test_every_object_validates_against_the_real_schemas(rendered, version: str) -> None:  # type: ignore[no-untyped-def]
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for key, doc in rendered.items():
        kubernetes_validate.validate(doc, version, strict=True)  # unknown or misspelt fields refused
        if key[0] != "Namespace":
            assert doc["metadata"]["namespace"] == "openforge", key


def _pod(obj: dict) -> dict:
    return obj["spec"]["template"]


def test_every_pod_passes_pod_security_restricted(rendered) -> None:  # type: ignore[no-untyped-def]
    from tests.k8s_double.admission import pod_security_violations

    for key in [("Deployment", "sglang-worker"), ("Deployment", "sglang-router"), ("Job", "forge-trainer")]:
        assert pod_security_violations(_pod(rendered[key]), "restricted") == [], key


def _config(rendered) -> ForgeConfig:  # type: ignore[no-untyped-def]
    return ForgeConfig.model_validate(tomllib.loads(rendered[("ConfigMap", "forge-cluster-config")]["data"]["forge.toml"]))


def test_workers_run_forges_own_sglang_launch(rendered) -> None:  # type: ignore[no-untyped-def]
    pod = _pod(rendered[("Deployment", "sglang-worker")])
    c = pod["spec"]["containers"][0]
    want = sglang_command(SglangEngineConfig(host="0.0.0.0", sglang_python="python3"), model_path="/models/policy",
                          port=30000, api_key="$(FORGE_WORKER_API_KEY)")
    assert c["command"] == want
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {m["mountPath"]: m.get("readOnly", False) for m in c["volumeMounts"]}["/data"] is True  # adapters, read
    assert c["ports"][0]["containerPort"] == 30000


def test_router_flags_parse_with_sglang_routers_own_parser_and_find_the_workers(rendered) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("sglang_router")
    from sglang_router.launch_router import parse_router_args

    c = _pod(rendered[("Deployment", "sglang-router")])["spec"]["containers"][0]
    assert c["command"][:3] == ["python", "-m", "sglang_router.launch_router"]
    args = parse_router_args(c["command"][3:])
    workers = rendered[("Deployment", "sglang-worker")]
    assert args.service_discovery and args.service_discovery_namespace == "openforge"
    assert args.selector and all(_pod(workers)["metadata"]["labels"].get(k) == v for k, v in args.selector.items())
    assert args.service_discovery_port == 30000 and args.policy == "manual"
    service = rendered[("Service", "sglang-router")]
    assert service["spec"]["ports"][0]["port"] == args.port
    rules = rendered[("Role", "sglang-router-discovery")]["rules"]
    assert rules == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    # forge's front in the trainer talks to that Service
    assert _config(rendered).engine.router_url == f"http://sglang-router.openforge.svc.cluster.local:{args.port}"
    assert _config(rendered).engine.kind == "router"


def test_trainer_job_runs_torchrun_with_one_pod_per_node(rendered) -> None:  # type: ignore[no-untyped-def]
    from torch.distributed.run import get_args_parser

    job = rendered[("Job", "forge-trainer")]
    spec, pod = job["spec"], _pod(job)
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    c = pod["spec"]["containers"][0]
    argv = shlex.split(c["args"][0].replace('"$JOB_COMPLETION_INDEX"', "0"))
    assert argv[:4] == ["exec", "python", "-m", "torch.distributed.run"]
    script = argv.index("-m", 4)
    run = get_args_parser().parse_args(argv[4:script + 2])
    assert int(run.nnodes) == spec["completions"]
    assert int(run.nproc_per_node) == c["resources"]["limits"]["nvidia.com/gpu"] == _config(rendered).trainer.nproc
    svc = rendered[("Service", "forge-trainer")]
    assert run.master_addr == f"{job['metadata']['name']}-0.{svc['metadata']['name']}"
    assert pod["spec"]["subdomain"] == svc["metadata"]["name"] and svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert argv[script:script + 2] == ["-m", "openforge.forge_cli.main"] and "train" in argv
    # index 0 is the run's controller: the base proxy Service and the sandbox egress policy reach it
    proxy = rendered[("Service", "forge-proxy")]
    assert all(pod["metadata"]["labels"].get(k) == v for k, v in proxy["spec"]["selector"].items())
    assert rendered[("Deployment", "forge-controller")]["spec"]["replicas"] == 0
    config = _config(rendered)
    assert config.proxy.port == 8700 and c["readinessProbe"]["tcpSocket"]["port"] == "proxy"
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"]
              if "persistentVolumeClaim" in v}
    workers = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in _pod(rendered[("Deployment", "sglang-worker")])
               ["spec"]["volumes"] if "persistentVolumeClaim" in v}
    assert claims["data"] == workers["shared"]  # the workers read the adapters rank 0 writes
    assert rendered[("PersistentVolumeClaim", claims["data"])]["spec"]["accessModes"] == ["ReadWriteMany"]
    assert {e["name"]: e.get("value") for e in c["env"]}["FORGE_HOME"] == "/data"
