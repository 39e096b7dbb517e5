"""deploy/k8s: every object validates against the Kubernetes client's models, and the pieces agree
with each other and with forge's config (names, ports, namespace, image, RBAC for what the backend does)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from kubernetes import client

from tests.helpers.paths import REPO
from openforge.config import load_config
from openforge.sandbox.k8s_manifests import build_pod_manifest, check_pod_manifest, pod_name

DEPLOY = REPO / "deploy" / "k8s"
MODELS = {
    "Namespace": client.V1Namespace, "ServiceAccount": client.V1ServiceAccount, "Role": client.V1Role,
    "RoleBinding": client.V1RoleBinding, "ConfigMap": client.V1ConfigMap,
    "PersistentVolumeClaim": client.V1PersistentVolumeClaim, "Deployment": client.V1Deployment,
    "Service": client.V1Service, "NetworkPolicy": client.V1NetworkPolicy,
}
# What sandbox/kubernetes.py calls: create/watch/delete pods, exec, gc by label, a compose service's log.
NEEDED = {"pods": {"create", "get", "list", "watch", "delete"}, "pods/exec": {"create", "get"}, "pods/log": {"get"}}


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
    assert listed == on_disk  # the egress policy included: applied by default


def test_config_services_and_rbac_agree(objs, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    toml = objs[("ConfigMap", "forge-config")]["data"]["forge.toml"]
    (tmp_path / "forge.toml").write_text(toml)
    config = load_config(tmp_path / "forge.toml")
    k8s = config.sandbox
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


def test_network_policy_denies_all_egress_but_the_proxy_and_dns(objs) -> None:  # type: ignore[no-untyped-def]
    from openforge.sandbox.k8s_manifests import pod_labels

    policy = objs[("NetworkPolicy", "sandboxes-reach-only-the-proxy")]["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels(run_id="r", rollout_id="x").items()
    assert set(policy["policyTypes"]) == {"Egress", "Ingress"} and "ingress" not in policy  # no ingress at all
    proxy, dns = policy["egress"]  # nothing else: no ipBlock (metadata endpoint, apiserver), no other pods
    controller_labels = objs[("Deployment", "forge-controller")]["spec"]["template"]["metadata"]["labels"]
    assert [list(t) for t in proxy["to"]] == [["podSelector"]]
    assert proxy["to"][0]["podSelector"]["matchLabels"].items() <= controller_labels.items()
    proxy_port = objs[("Service", "forge-proxy")]["spec"]["ports"][0]["port"]  # = the container's port (above)
    assert proxy["ports"] == [{"protocol": "TCP", "port": proxy_port}]
    assert dns["to"] == [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]
    assert sorted(p["protocol"] for p in dns["ports"]) == ["TCP", "UDP"] and {p["port"] for p in dns["ports"]} == {53}


def test_the_namespace_enforces_restricted_and_the_controller_complies(objs) -> None:  # type: ignore[no-untyped-def]
    from tests.k8s_double.admission import pod_security_violations

    labels = objs[("Namespace", "openforge")]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    template = objs[("Deployment", "forge-controller")]["spec"]["template"]
    assert pod_security_violations(template, "restricted") == []


@pytest.mark.parametrize("version", ["1.30", "1.37"])
def test_manifests_validate_against_the_real_schemas(objs, version: str) -> None:  # type: ignore[no-untyped-def]
    # kubernetes-validate bundles the API server's OpenAPI schemas (strict: unknown fields refused).
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = list(objs.values())
    toml = objs[("ConfigMap", "forge-config")]["data"]["forge.toml"]
    from openforge.config import ForgeConfig
    import tomllib

    sandbox = ForgeConfig.model_validate(tomllib.loads(toml)).sandbox
    docs.append(build_pod_manifest(sandbox, name=pod_name("ro-1"), run_id="run-1", rollout_id="ro-1", home="/data"))
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)
