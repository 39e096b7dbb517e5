"""Every Pod manifest the backend generates, validated against the Kubernetes client's own models,
and the pod states it reads back. No cluster or double needed."""

from __future__ import annotations

import json

import pytest
from tests.k8s_double.admission import admit_pod, pod_security_violations
from kubernetes.client import ApiClient, V1Pod

from openforge.config import KubernetesSandboxConfig
from openforge.errors import ConfigError, SandboxError
from openforge.sandbox.k8s_exec import exit_code_from_status, wrap_command
from openforge.sandbox.k8s_manifests import (
    KEEPER, build_pod_manifest, check_pod_manifest, home_label, label_value, managed_selector, pod_name,
)
from openforge.sandbox.k8s_status import pod_state

GPU_POOL = {
    "namespace": "rl", "image": "registry.example.com/forge/sandbox:2026.12", "cpu_request": "250m",
    "cpu_limit": "4", "memory_request": "1Gi", "memory_limit": "8Gi", "node_selector": {
        "cloud.google.com/gke-accelerator": "nvidia-h100-80gb", "pool": "rollouts"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                    {"key": "spot", "operator": "Equal", "value": "true", "effect": "NoExecute",
                     "tolerationSeconds": 120}],
    "image_pull_secrets": ["regcred", "mirror"], "service_account": "forge-sandbox", "active_deadline_s": 900,
}


def manifest(**k8s) -> dict:
    config = KubernetesSandboxConfig(workdir="/work", **k8s)
    return build_pod_manifest(config, name=pod_name("ro-20261202-abc123"), run_id="run-20261202-1f3a9c",
                              rollout_id="ro-20261202-abc123")


@pytest.mark.parametrize("k8s", [{}, GPU_POOL], ids=["defaults", "gpu-pool"])
def test_manifest_round_trips_through_the_client_model(k8s: dict) -> None:
    m = manifest(**k8s)
    check_pod_manifest(m)
    pod = V1Pod.model_validate(m)  # strict: an unknown or misspelt key would raise
    # Serialising the model gives back exactly what we send: every key is a real field, nothing dropped.
    assert ApiClient().sanitize_for_serialization(pod) == json.loads(json.dumps(m))
    spec = pod.spec
    assert spec.restart_policy == "Never" and spec.active_deadline_seconds == k8s.get("active_deadline_s", 3600)
    c = spec.containers[0]
    assert c.command == ["sh", "-c", KEEPER]
    assert c.working_dir == "/work" and not c.stdin and not c.tty
    assert pod.metadata.labels == {"openforge.managed": "1", "openforge.run": "run-20261202-1f3a9c",
                                   "openforge.rollout": "ro-20261202-abc123"}
    assert spec.enable_service_links is False


def test_gpu_pool_settings_reach_the_pod() -> None:
    spec = V1Pod.model_validate(manifest(**GPU_POOL)).spec
    assert spec.node_selector == GPU_POOL["node_selector"]
    assert [(t.key, t.operator, t.effect, t.toleration_seconds) for t in spec.tolerations] == [
        ("nvidia.com/gpu", "Exists", "NoSchedule", None), ("spot", "Equal", "NoExecute", 120)]
    assert [s.name for s in spec.image_pull_secrets] == ["regcred", "mirror"]
    assert spec.service_account_name == "forge-sandbox" and spec.automount_service_account_token is True
    res = spec.containers[0].resources
    assert res.requests == {"cpu": "250m", "memory": "1Gi", "ephemeral-storage": "1Gi"}
    assert res.limits == {"cpu": "4", "memory": "8Gi", "ephemeral-storage": "8Gi"}


@pytest.mark.parametrize("k8s", [{}, GPU_POOL], ids=["defaults", "gpu-pool"])
def test_every_manifest_passes_pod_security_restricted(k8s: dict) -> None:
    m = manifest(**k8s)
    assert pod_security_violations(m, "restricted") == [] and admit_pod(m) == []
    c = m["spec"]["containers"][0]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    # What the read-only root leaves writable: the workdir, $HOME and /tmp, each an emptyDir, and the grader's
    # folder (emptied once the agent is gone, sandbox/kubernetes.py grader_folder).
    mounts = {v["mountPath"]: v["name"] for v in c["volumeMounts"]}
    assert set(mounts) == {"/work", "/home/forge", "/tmp", "/forge-grader"}
    assert {v["name"]: v for v in m["spec"]["volumes"]}.keys() == set(mounts.values())
    assert all("emptyDir" in v for v in m["spec"]["volumes"])
    assert {"name": "HOME", "value": "/home/forge"} in c["env"]


@pytest.mark.parametrize("breaks, violation", [
    (lambda m: m["spec"]["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
     'allowPrivilegeEscalation != false (container "sandbox" must set securityContext.allowPrivilegeEscalation=false)'),
    (lambda m: m["spec"]["containers"][0]["securityContext"]["capabilities"].update(drop=["NET_RAW"]),
     'unrestricted capabilities (container "sandbox" must set securityContext.capabilities.drop=["ALL"])'),
    (lambda m: [sc.pop("runAsNonRoot") for sc in (m["spec"]["securityContext"],
                                                  m["spec"]["containers"][0]["securityContext"])],
     'runAsNonRoot != true (pod or container "sandbox" must set securityContext.runAsNonRoot=true)'),
    (lambda m: m["spec"]["securityContext"].update(runAsUser=0), "runAsUser=0"),
    (lambda m: m["spec"]["securityContext"].pop("seccompProfile"), 'seccompProfile (pod or container "sandbox" must'),
    (lambda m: m["spec"]["volumes"].append({"name": "host", "hostPath": {"path": "/"}}), 'hostPath volumes (volume "host")'),
    (lambda m: m["spec"].update(hostNetwork=True), "host namespaces (hostNetwork=true)"),
])
def test_the_double_refuses_what_restricted_refuses(breaks, violation: str) -> None:  # type: ignore[no-untyped-def]
    m = manifest()
    breaks(m)
    assert any(v.startswith(violation) for v in pod_security_violations(m, "restricted"))


def test_defaults_keep_api_credentials_out_of_the_sandbox() -> None:
    spec = manifest()["spec"]
    assert spec["automountServiceAccountToken"] is False and "serviceAccountName" not in spec
    assert not {"nodeSelector", "tolerations", "imagePullSecrets"} & set(spec)


@pytest.mark.parametrize("k8s, why", [
    ({"tolerations": [{"key": "gpu", "operator": "Exist"}]}, "operator must be Exists or Equal"),
    ({"tolerations": [{"key": "gpu", "tolerationSecond": 5}]}, "tolerations.0.tolerationSecond"),
    ({"tolerations": [{"key": "gpu", "effect": "NoSchedul"}]}, "effect must be"),
    ({"memory_limit": "2 GB"}, "resources.limits.memory '2 GB' is not a quantity"),
    ({"cpu_request": "4", "cpu_limit": "2"}, "requests.cpu 4 is above its limit 2"),
    ({"node_selector": {"pool": "a b"}}, "label value 'a b'"),
    ({"node_selector": {"-bad": "x"}}, "label key '-bad'"),
    ({"image": ""}, "has no image"),
])
def test_bad_settings_fail_before_reaching_a_cluster(k8s: dict, why: str) -> None:
    with pytest.raises(ConfigError, match="invalid pod manifest") as info:
        check_pod_manifest(manifest(**k8s))
    assert why in str(info.value) and "\n" not in str(info.value)


def test_names_and_labels_are_always_valid() -> None:
    name = pod_name("RO_" + "x" * 200)
    assert name.startswith("forge-ro-") and len(name) <= 63 and name == name.lower()
    assert pod_name("ro-1") != pod_name("ro-1")  # a retried start never collides with a lingering pod
    assert label_value("run/with spaces" + "y" * 80) == ("run-with-spaces" + "y" * 80)[:63]
    assert managed_selector("run-1") == "openforge.managed=1,openforge.run=run-1"
    assert managed_selector("run-1", home="/d") == f"openforge.managed=1,openforge.home={home_label('/d')},openforge.run=run-1"
    assert home_label("/d") != home_label("/e") and len(home_label("/" + "x" * 500)) <= 63
    config = KubernetesSandboxConfig()
    check_pod_manifest(build_pod_manifest(config, name=name, run_id="Run ID!" * 20, rollout_id="r" * 90))


def _pod(status: dict) -> V1Pod:
    return V1Pod.from_dict({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "sandbox"}]},
                            "status": status})


def _cs(state: dict) -> dict:
    return {"name": "sandbox", "image": "i", "imageID": "", "ready": False, "restartCount": 0, "state": state}


@pytest.mark.parametrize("status, state, why", [
    ({"phase": "Pending"}, "pending", "phase Pending"),
    ({"phase": "Pending", "containerStatuses": [_cs({"waiting": {"reason": "ContainerCreating"}})]},
     "pending", "ContainerCreating"),
    ({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                          "message": "0/3 nodes are available: 3 Insufficient cpu."}]},
     "pending", "Unschedulable: 0/3 nodes are available: 3 Insufficient cpu."),
    ({"phase": "Pending", "containerStatuses": [_cs({"waiting": {"reason": "CreateContainerError",
                                                                 "message": "context deadline exceeded"}})]},
     "pending", "CreateContainerError: context deadline exceeded"),  # the kubelet retries it
    ({"phase": "Pending", "containerStatuses": [_cs({"waiting": {"reason": "CreateContainerConfigError",
                                                                 "message": 'secret "x" not found'}})]},
     "failed", 'CreateContainerConfigError: secret "x" not found'),
    ({"phase": "Running", "containerStatuses": [_cs({"running": {"startedAt": "2026-12-02T10:00:00Z"}})]},
     "running", ""),
    ({"phase": "Failed", "reason": "DeadlineExceeded",
      "message": "Pod was active on the node longer than the specified deadline"},
     "failed", "phase Failed: DeadlineExceeded Pod was active on the node longer than the specified deadline"),
    ({"phase": "Failed", "containerStatuses": [_cs({"terminated": {"exitCode": 137, "reason": "OOMKilled"}})]},
     "failed", "phase Failed: container OOMKilled (exit code 137)"),
])
def test_pod_state_reads_the_reason(status: dict, state: str, why: str) -> None:
    assert pod_state(_pod(status)) == (state, why)


def test_exec_status_channel() -> None:
    assert exit_code_from_status(b'{"metadata":{},"status":"Success"}') == 0
    failure = {"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
               "message": "command terminated with non-zero exit code: exit code 2",
               "details": {"causes": [{"reason": "ExitCode", "message": "2"}]}}
    assert exit_code_from_status(json.dumps(failure).encode()) == 2
    with pytest.raises(SandboxError, match="container not found"):
        exit_code_from_status(b'{"status":"Failure","reason":"InternalError","message":"container not found"}')
    with pytest.raises(SandboxError, match="no exit status"):
        exit_code_from_status(b"")


def test_wrap_command_quotes_and_refuses_bad_env() -> None:
    argv = wrap_command(["echo", "a'b"], cwd="/w s", env={"K": "v w"}, timeout=2, stdin_len=None)
    assert argv[:2] == ["sh", "-c"] and "cd '/w s'" in argv[2] and "'K=v w'" in argv[2]
    assert "timeout -k 2 2.000 env OPENFORGE_EXEC=" in argv[2] and "</dev/null" in argv[2]
    assert argv[2].endswith("exit $rc")  # the command's status, after its leftovers are reaped
    capped = wrap_command("yes", cwd="/", env=None, timeout=1, stdin_len=None, limit=100)[2]
    assert capped.count("{ head -c 101; cat >/dev/null; }") == 2  # stdout and stderr cut in the pod
    assert "head -c 7 |" in wrap_command("cat", cwd="/", env=None, timeout=1, stdin_len=7)[2]
    with pytest.raises(SandboxError, match="invalid environment variable name"):
        wrap_command("true", cwd="/", env={"A B": "x"}, timeout=1, stdin_len=None)
