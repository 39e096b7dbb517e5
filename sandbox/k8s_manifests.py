"""The Pod a rollout's sandbox runs in, built as the plain JSON the API server takes, and checked.

Kept apart from the backend so the manifest can be built and validated without a cluster: the tests
deserialize every manifest into the client's own `V1Pod` model (strict: unknown keys are refused),
and `check_pod_manifest` adds the API server's rules the model does not enforce (names, label syntax,
enums, quantities), so a typo in the kubernetes `[sandbox]` table fails here with one line instead of a 422
from the cluster after a scheduling round trip.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import secrets
from pathlib import Path
from typing import Any

from openforge.config import KubernetesSandboxConfig
from openforge.errors import ConfigError
from openforge.sandbox.base import GRADER_DIR, LABEL_HOME, LABEL_MANAGED, LABEL_RUN, sandbox_labels
from openforge.sandbox.compose import DROPPED_CAPABILITIES, ComposeService

CONTAINER_NAME = "sandbox"
# PID 1 of every pod: a shell that keeps a `sleep` going and, waiting on it, reaps the orphans that
# execs leave (a bare `sleep` as PID 1 reaps nothing: zombies would pile up against the PID limit).
# It ends at once on the TERM of a graceful delete; `kill_all` kills the keeper and PID 1 starts another.
KEEPER = 'trap "exit 0" TERM; while :; do sleep 3600 & wait $!; done'

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_TOLERATION_OPERATORS = {"Exists", "Equal"}
_TAINT_EFFECTS = {"", "NoSchedule", "PreferNoSchedule", "NoExecute"}


def label_value(raw: str) -> str:
    """A string made safe as a label value (<= 63 chars of [A-Za-z0-9-_.], alphanumeric at the ends)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "-", raw)[:63]
    return cleaned.strip("-_.")


def pod_name(rollout_id: str) -> str:
    """`forge-<rollout>-<6 hex>`: unique per start attempt, because a pod deleted with grace 0 can
    linger in the API for a moment and a retried start must not collide with it (409)."""
    slug = re.sub(r"[^a-z0-9-]", "-", rollout_id.lower()).strip("-")[:48].strip("-") or "rollout"
    return f"forge-{slug}-{secrets.token_hex(3)}"


def home_label(home: Path | str) -> str:
    """The `openforge.home` label value of a data dir: its path does not fit a label value, a hash does."""
    return "h" + hashlib.sha256(str(home).encode()).hexdigest()[:20]


def pod_labels(*, run_id: str, rollout_id: str, home: Path | str | None = None) -> dict[str, str]:
    """The labels every backend uses (sandbox.base), made valid as Kubernetes label values, and the
    data dir's (`forge gc` of one FORGE_HOME only sees its own pods)."""
    labels = {key: label_value(value) for key, value in sandbox_labels(run_id, rollout_id).items()}
    if home is not None:
        labels[LABEL_HOME] = home_label(home)
    return labels


def managed_selector(run_id: str | None = None, home: Path | str | None = None) -> str:
    """The label selector of every pod forge made (of one run, of one data dir, when given)."""
    managed = sandbox_labels("", "")[LABEL_MANAGED]
    return (f"{LABEL_MANAGED}={managed}" + (f",{LABEL_HOME}={home_label(home)}" if home is not None else "")
            + (f",{LABEL_RUN}={label_value(run_id)}" if run_id else ""))


def build_pod_manifest(config: KubernetesSandboxConfig, *, name: str, run_id: str, rollout_id: str,
                       home: Path | str | None = None) -> dict[str, Any]:
    """One Pod per rollout: a keeper loop (`KEEPER`) that execs land in, deleted when the rollout ends.

    It passes Pod Security `restricted`: a non-root uid, no privilege escalation, every capability
    dropped, the runtime's seccomp profile. The root filesystem is read-only; the workdir, $HOME and
    /tmp are emptyDir volumes (counted against `ephemeral-storage`), writable by the pod's group, and so is
    /forge-grader, the grader's folder (`grader_folder` empties it once the agent is gone).
    `activeDeadlineSeconds` is the backstop for a controller that crashed before deleting its pods;
    `forge gc` is the other. The service-account token is only mounted when a service account is
    configured: agent code runs in this pod and should not be handed API credentials by default.
    """
    k8s = config
    mounts = {"workdir": config.workdir, "home": k8s.home, "tmp": "/tmp", "grader": GRADER_DIR}
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "activeDeadlineSeconds": k8s.active_deadline_s,
        "terminationGracePeriodSeconds": k8s.delete_grace_s,
        # Service env vars of every Service in the namespace would leak into the harness environment.
        "enableServiceLinks": False,
        "automountServiceAccountToken": bool(k8s.service_account),
        "securityContext": {
            "runAsNonRoot": True, "runAsUser": k8s.run_as_user, "runAsGroup": k8s.run_as_group,
            "fsGroup": k8s.run_as_group, "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumes": [{"name": vol, "emptyDir": {}} for vol in mounts],
        "containers": [_container(config, mounts)],
    }
    if k8s.compose_services:
        _add_services(spec, config)
    if k8s.node_selector:
        spec["nodeSelector"] = dict(k8s.node_selector)
    if k8s.tolerations:
        spec["tolerations"] = [dict(t) for t in k8s.tolerations]
    if k8s.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in k8s.image_pull_secrets]
    if k8s.service_account:
        spec["serviceAccountName"] = k8s.service_account
    annotations = {"openforge.run-id": run_id, "openforge.rollout-id": rollout_id}
    if home is not None:
        annotations["openforge.home"] = str(home)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": k8s.namespace,
            "labels": pod_labels(run_id=run_id, rollout_id=rollout_id, home=home),
            # Labels are sanitised and cut at 63 chars; the exact ids are kept here.
            "annotations": annotations,
        },
        "spec": spec,
    }


def _container(config: KubernetesSandboxConfig, mounts: dict[str, str]) -> dict[str, Any]:
    k8s = config
    return {
        "name": CONTAINER_NAME,
        "image": k8s.image,
        # Hundreds of pods per step: do not ask the registry for every one. Pin image tags.
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", KEEPER],
        "workingDir": config.workdir,
        "env": [{"name": "HOME", "value": k8s.home}, {"name": "TMPDIR", "value": "/tmp"}],
        "resources": {
            "requests": {"cpu": k8s.cpu_request, "memory": k8s.memory_request,
                         "ephemeral-storage": k8s.ephemeral_storage_request},
            "limits": {"cpu": k8s.cpu_limit, "memory": k8s.memory_limit,
                       "ephemeral-storage": k8s.ephemeral_storage_limit},
        },
        "securityContext": {
            "allowPrivilegeEscalation": False, "privileged": False, "readOnlyRootFilesystem": True,
            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": vol, "mountPath": path} for vol, path in mounts.items()],
        "stdin": False,
        "tty": False,
    }


SERVICE_PREFIX = "svc-"  # a compose service's container: `svc-<name>`, never the agent's CONTAINER_NAME


def service_container_name(service: str) -> str:
    return f"{SERVICE_PREFIX}{service}"


def _add_services(spec: dict[str, Any], config: KubernetesSandboxConfig) -> None:
    """A task's compose services (sandbox/compose.py) as more containers of the rollout's pod: a pod's
    containers share one network namespace, so `hostAliases` maps every service name to 127.0.0.1 and the
    agent reaches `db:5432` as on Docker's per-rollout network. Each keeps its image's user, entrypoint and
    working directory (its compose `command` is the container's `args`, as Compose's replaces the image's
    CMD), gets the hardening of sandbox/compose.py and the agent's container's resources, and mounts none
    of the agent's volumes; the PID namespaces stay apart (no shareProcessNamespace). The image's user
    may be root, so the pod's user moves from the pod to the agent's container."""
    services = [ComposeService(**s) for s in config.compose_services]
    agent = spec["containers"][0]
    psc = spec["securityContext"]
    for key in ("runAsNonRoot", "runAsUser", "runAsGroup"):
        agent["securityContext"][key] = psc.pop(key)
    spec["hostAliases"] = [{"ip": "127.0.0.1", "hostnames": [s.name for s in services]}]
    for service in services:
        container: dict[str, Any] = {
            "name": service_container_name(service.name),
            "image": service.image,
            "imagePullPolicy": "IfNotPresent",
            "env": [{"name": k, "value": v} for k, v in service.environment.items()],
            "resources": {kind: dict(agent["resources"][kind]) for kind in ("requests", "limits")},
            "securityContext": {"allowPrivilegeEscalation": False, "privileged": False,
                                "capabilities": {"drop": list(DROPPED_CAPABILITIES)}},
        }
        if service.command is not None:
            # Compose splits a string command as a shell would, without running one (docker-py's shlex.split).
            container["args"] = shlex.split(service.command) if isinstance(service.command, str) else service.command
        spec["containers"].append(container)


# The controller pod's label (deploy/k8s/controller.yaml): the proxy and the site relay run in it.
CONTROLLER_LABELS = {"app.kubernetes.io/name": "forge-controller"}
NETWORK_POLICY_NAME = "sandboxes-reach-only-the-proxy"


# Egress of `sandbox.allow_internet`: the public web's ports on any address but the private (RFC 1918),
# carrier-grade NAT, link-local (169.254.169.254 is the clouds' metadata service) and loopback ranges.
_NOT_PUBLIC = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16", "127.0.0.0/8"]
_PUBLIC_WEB = {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": _NOT_PUBLIC}}],
               "ports": [{"protocol": "TCP", "port": 80}, {"protocol": "TCP", "port": 443}]}


def sandbox_network_policy(config: KubernetesSandboxConfig, *, proxy_port: int, gui: bool = False,
                           controller_labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The rollout pods' NetworkPolicy (deploy/k8s/sandbox-networkpolicy.yaml is this, without `gui`):
    no ingress; egress only to the controller's proxy port (`proxy_port`, the container's port: a
    policy sees the pod's port after the Service) and cluster DNS. With `gui` (a run of GUI tasks) the
    controller's site relay port (`site_relay_port`) too, and only then: its port must be fixed. With
    `sandbox.allow_internet` (a run of online-only web tasks) also HTTP and HTTPS to public addresses,
    never to private, link-local (cloud metadata) or shared ranges, so the cluster stays out of reach.
    Same name as the default, so `kubectl apply` of one replaces the other."""
    ports = [{"protocol": "TCP", "port": proxy_port}]
    if gui:
        if not config.site_relay_port:
            raise ConfigError("a GUI run's network policy needs a fixed sandbox.site_relay_port (0 picks a free "
                              "port at run time, which no policy can name)")
        if config.site_relay_port == proxy_port:
            raise ConfigError(f"sandbox.site_relay_port {config.site_relay_port} is the proxy's port")
        ports.append({"protocol": "TCP", "port": config.site_relay_port})
    managed = sandbox_labels("", "")[LABEL_MANAGED]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": NETWORK_POLICY_NAME, "namespace": config.namespace,
                     "labels": {"app.kubernetes.io/part-of": "openforge"}},
        "spec": {
            "podSelector": {"matchLabels": {LABEL_MANAGED: managed}},
            "policyTypes": ["Egress", "Ingress"],
            "egress": [
                {"to": [{"podSelector": {"matchLabels": dict(controller_labels or CONTROLLER_LABELS)}}], "ports": ports},
                {"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                 "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
                *([_PUBLIC_WEB] if config.allow_internet else []),
            ],
        },
    }


def check_pod_manifest(manifest: dict[str, Any]) -> None:
    """Raise ConfigError (one line) if the API server would refuse this Pod; return None if it is fine."""
    from kubernetes.client import V1Pod
    from kubernetes.utils import parse_quantity
    from pydantic import ValidationError

    try:
        # model_validate, not from_dict: from_dict drops keys it does not know, model_validate refuses them.
        V1Pod.model_validate(manifest)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"invalid pod manifest: {where}: {first['msg']}") from None
    meta, spec = manifest["metadata"], manifest["spec"]
    problems: list[str] = []
    if len(meta["name"]) > 63 or not _DNS1123_LABEL.match(meta["name"]):
        problems.append(f"metadata.name {meta['name']!r} is not a DNS-1123 label")
    for key, value in {**meta.get("labels", {}), **spec.get("nodeSelector", {})}.items():
        prefix, _, name = key.rpartition("/")
        if len(name) > 63 or not _LABEL_NAME.match(name) or (prefix and not _is_dns_subdomain(prefix)):
            problems.append(f"label key {key!r} is invalid")
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            problems.append(f"label value {value!r} (key {key}) is invalid")
    for alias in spec.get("hostAliases", []):
        problems += [f"hostAliases: {h!r} is not a DNS-1123 subdomain"
                     for h in alias["hostnames"] if not _is_dns_subdomain(h)]
    if spec.get("restartPolicy") not in {"Always", "OnFailure", "Never"}:
        problems.append(f"spec.restartPolicy {spec.get('restartPolicy')!r} is not Always/OnFailure/Never")
    for i, tol in enumerate(spec.get("tolerations", [])):
        if tol.get("operator", "Equal") not in _TOLERATION_OPERATORS:
            problems.append(f"tolerations[{i}].operator must be Exists or Equal")
        if tol.get("effect", "") not in _TAINT_EFFECTS:
            problems.append(f"tolerations[{i}].effect must be NoSchedule, PreferNoSchedule or NoExecute")
        if tol.get("operator") == "Exists" and tol.get("value"):
            problems.append(f"tolerations[{i}]: operator Exists takes no value")
    for c in spec["containers"]:
        if len(c["name"]) > 63 or not _DNS1123_LABEL.match(c["name"]):
            problems.append(f"container name {c['name']!r} is not a DNS-1123 label")
        if not c.get("image"):
            problems.append(f"container {c['name']!r} has no image")
        resources = c.get("resources", {})
        for kind in ("requests", "limits"):
            for res, qty in resources.get(kind, {}).items():
                try:
                    parse_quantity(qty)
                except ValueError:
                    problems.append(f"resources.{kind}.{res} {qty!r} is not a quantity (e.g. 500m, 2, 512Mi)")
        for res, qty in resources.get("requests", {}).items():
            limit = resources.get("limits", {}).get(res)
            if limit is not None and _quantity_ok(qty) and _quantity_ok(limit) \
                    and parse_quantity(qty) > parse_quantity(limit):
                problems.append(f"resources.requests.{res} {qty} is above its limit {limit}")
    if problems:
        raise ConfigError("invalid pod manifest: " + "; ".join(problems))


def _quantity_ok(qty: str) -> bool:
    from kubernetes.utils import parse_quantity

    try:
        parse_quantity(qty)
    except ValueError:
        return False
    return True


def _is_dns_subdomain(value: str) -> bool:
    return len(value) <= 253 and all(_DNS1123_LABEL.match(part) for part in value.split("."))


def main(argv: list[str] | None = None) -> int:
    """`python -m openforge.sandbox.k8s_manifests network-policy [--config forge.toml] [--gui]`: the rollout pods'
    NetworkPolicy for this config as JSON, for `kubectl apply -f -`."""
    import argparse
    import json
    import sys

    from openforge.config import load_config
    from openforge.errors import ForgeError

    parser = argparse.ArgumentParser(prog="python -m openforge.sandbox.k8s_manifests")
    parser.add_argument("what", choices=["network-policy"])
    parser.add_argument("--config", default="forge.toml", help="the run's forge.toml (sandbox.type = kubernetes)")
    parser.add_argument("--gui", action="store_true", help="a run of GUI tasks, or of tasks with tools or services: "
                                                               "allow the site relay's port too")
    args = parser.parse_args(argv)
    try:
        config = load_config(Path(args.config))
        if config.sandbox.type != "kubernetes":
            raise ConfigError(f"{args.config}: sandbox.type is {config.sandbox.type!r}, not kubernetes")
        policy = sandbox_network_policy(config.sandbox, proxy_port=config.proxy.port, gui=args.gui)
    except ForgeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(policy, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
