"""deploy/k8s: every object validates against the Kubernetes client's models, and the pieces agree
with each other and with forge's config (names, ports, namespace, image, RBAC for what the backend does)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from kubernetes import client

from openforge.config import load_config
from sandbox.k8s_manifests import build_pod_manifest, check_pod_manifest, pod_name

DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "k8s"
MODELS = {
    "Namespace": client.V1Namespace, "ServiceAccount": client.V1ServiceAccount, "Role": client.V1Role,
    "RoleBinding": client.V1RoleBinding, "ConfigMap": client.V1ConfigMap,
    "PersistentVolumeClaim": client.V1PersistentVolumeClaim, "Deployment": client.V1Deployment,
    "Service": client.V1Service, "NetworkPolicy": client.V1NetworkPolicy,
}
# What sandbox/kubernetes.py calls: create/watch/delete pods, exec, gc by label.
NEEDED = {"pods": {"create", "get", "list", "watch", "delete"}, "pods/exec": {"create", "get"}}


def objects() -> dict[tuple[str, str], dict]:
    found = {}
    for path in sorted(DEPLOY.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            found[(doc["kind"], doc["metadata"]["name"])] = doc
    return found


@pytest.fixture(scope="module")
def objs() -> dict[tuple[str, str], dict]:
    return objects()


def test_every_object_is_a_valid_kubernetes_object(objs) -> None:  # type: ignore[no-untyped-def]
    assert {kind for kind, _ in objs} == set(MODELS)
    for (kind, name), doc in objs.items():
        MODELS[kind].model_validate(doc)  # strict: a misspelt field anywhere fails here
        if kind != "Namespace":
            assert doc["metadata"]["namespace"] == "openforge", name
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    on_disk = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert on_disk - listed == {"sandbox-networkpolicy.yaml"}  # the one optional piece
    assert listed <= on_disk


def test_config_services_and_rbac_agree(objs, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    toml = objs[("ConfigMap", "forge-config")]["data"]["forge.toml"]
    (tmp_path / "forge.toml").write_text(toml)
    config = load_config(tmp_path / "forge.toml")
    k8s = config.sandbox.kubernetes
    assert config.sandbox.type == "kubernetes" and k8s.namespace == "openforge"

    service = objs[("Service", "forge-proxy")]
    url = urlparse(k8s.proxy_url)
    assert url.hostname in ("forge-proxy.openforge", "forge-proxy.openforge.svc.cluster.local")
    assert url.port == service["spec"]["ports"][0]["port"] == config.proxy.port
    assert config.proxy.host == "0.0.0.0"  # reachable from other pods

    deployment = objs[("Deployment", "forge-controller")]
    pod = deployment["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    container = pod["spec"]["containers"][0]
    assert container["image"] == k8s.image  # rollout pods run the controller's image
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["proxy"] == config.proxy.port
    assert "--config /etc/forge/forge.toml up --headless" in container["args"][0]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["config"] == "/etc/forge"
    assert {e["name"]: e["value"] for e in container["env"]}["FORGE_HOME"] == mounts["data"]

    account = pod["spec"]["serviceAccountName"]
    binding = objs[("RoleBinding", "forge-controller-sandboxes")]
    assert ("ServiceAccount", account) in objs
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "openforge"}]
    rules = objs[("Role", binding["roleRef"]["name"])]["rules"]
    granted: dict[str, set[str]] = {}
    for rule in rules:
        for resource in rule["resources"]:
            granted.setdefault(resource, set()).update(rule["verbs"])
    for resource, verbs in NEEDED.items():
        assert verbs <= granted.get(resource, set()), resource

    # The pods this config makes are valid too.
    check_pod_manifest(build_pod_manifest(config.sandbox, name=pod_name("ro-1"), run_id="run-1", rollout_id="ro-1"))


def test_network_policy_selects_the_sandbox_pods(objs) -> None:  # type: ignore[no-untyped-def]
    from sandbox.k8s_manifests import pod_labels

    policy = objs[("NetworkPolicy", "sandboxes-reach-only-the-proxy")]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels(run_id="r", rollout_id="x").items()
    controller_labels = objs[("Deployment", "forge-controller")]["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["egress"][0]["to"][0]["podSelector"]["matchLabels"].items() <= controller_labels.items()
