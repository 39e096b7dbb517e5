"""Admission as the apiserver applies it to a pod create: validation (422 Invalid) and Pod Security
admission (403 Forbidden), written from the upstream rules (k8s.io/pod-security-admission/policy,
the `baseline` and `restricted` levels, "latest") and their messages, independently of the backend's
own manifest code so that a backend bug cannot hide in a shared check."""

from __future__ import annotations

import re
from typing import Any

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# Baseline allows adding these; restricted allows adding NET_BIND_SERVICE only.
_BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                  "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
_RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                       "projected", "secret"}


def admit_pod(obj: dict[str, Any]) -> list[str]:
    """The validation errors the apiserver would return (422), in its wording; [] = admitted."""
    problems = []
    name = obj.get("metadata", {}).get("name", "")
    if not name:
        problems.append("metadata.name: Required value: name or generateName is required")
    elif len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
        problems.append(f'metadata.name: Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist '
                        "of lower case alphanumeric characters, '-' or '.'")
    spec = obj.get("spec") or {}
    containers = spec.get("containers") or []
    if not containers:
        problems.append("spec.containers: Required value")
    volumes = {v.get("name") for v in spec.get("volumes") or []}
    seen: set[str] = set()
    for i, c in enumerate(containers):
        if not c.get("name"):
            problems.append(f"spec.containers[{i}].name: Required value")
        elif len(c["name"]) > 63 or not _DNS1123_LABEL.match(c["name"]):
            problems.append(f'spec.containers[{i}].name: Invalid value: "{c["name"]}": a lowercase RFC 1123 label '
                            "must consist of lower case alphanumeric characters or '-'")
        elif c["name"] in seen:
            problems.append(f'spec.containers[{i}].name: Duplicate value: "{c["name"]}"')
        seen.add(c.get("name", ""))
        if not c.get("image"):
            problems.append(f"spec.containers[{i}].image: Required value")
        for j, m in enumerate(c.get("volumeMounts") or []):
            if m.get("name") not in volumes:
                problems.append(f'spec.containers[{i}].volumeMounts[{j}].name: Not found: "{m.get("name")}"')
    for i, alias in enumerate(spec.get("hostAliases") or []):
        for j, host in enumerate(alias.get("hostnames") or []):
            if len(host) > 253 or not _DNS1123_SUBDOMAIN.match(host):
                problems.append(f'spec.hostAliases[{i}].hostnames[{j}]: Invalid value: "{host}": a lowercase RFC '
                                "1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'")
    if spec.get("restartPolicy", "Always") not in ("Always", "OnFailure", "Never"):
        problems.append(f'spec.restartPolicy: Unsupported value: "{spec["restartPolicy"]}"')
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and (not isinstance(deadline, int) or deadline <= 0):
        problems.append(f"spec.activeDeadlineSeconds: Invalid value: {deadline}: must be greater than 0")
    return problems


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or []),
            *(spec.get("ephemeralContainers") or [])]


def _names(cs: list[dict[str, Any]]) -> str:
    quoted = ", ".join(f'"{c.get("name", "")}"' for c in cs)
    return ("container " if len(cs) == 1 else "containers ") + quoted


def _must(cs: list[dict], what: str) -> str:
    return f"{_names(cs)} must {what}"


def pod_security_violations(obj: dict[str, Any], level: str) -> list[str]:
    """The violations Pod Security admission lists for `level` ("baseline" or "restricted"), in order
    and wording; [] = allowed."""
    if level not in ("baseline", "restricted"):
        return []
    spec = obj.get("spec") or {}
    psc = spec.get("securityContext") or {}
    cs = _containers(spec)
    sc = {id(c): c.get("securityContext") or {} for c in cs}
    out: list[str] = []
    hosts = [k for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    if hosts:
        out.append("host namespaces (" + ", ".join(f"{k}=true" for k in hosts) + ")")
    if bad := [c for c in cs if sc[id(c)].get("privileged")]:
        out.append(f"privileged ({_must(bad, 'not set securityContext.privileged=true')})")
    added = {id(c): set((sc[id(c)].get("capabilities") or {}).get("add") or []) for c in cs}
    if bad := [c for c in cs if added[id(c)] - _BASELINE_CAPS]:
        extra = ", ".join(sorted(set().union(*(added[id(c)] - _BASELINE_CAPS for c in bad))))
        out.append(f"non-default capabilities ({_must(bad, f'not include {extra} in securityContext.capabilities.add')})")
    if host_paths := [v["name"] for v in spec.get("volumes") or [] if "hostPath" in v]:
        out.append("hostPath volumes (" + ", ".join(f'volume "{n}"' for n in host_paths) + ")")
    if bad := [c for c in cs if any(p.get("hostPort") for p in c.get("ports") or [])]:
        out.append(f"hostPort ({_must(bad, 'not use hostPort')})")
    seccomp = {id(c): (sc[id(c)].get("seccompProfile") or {}).get("type") for c in cs}
    if (psc.get("seccompProfile") or {}).get("type") == "Unconfined" or "Unconfined" in seccomp.values():
        out.append('seccompProfile (pod or containers must not set securityContext.seccompProfile.type to "Unconfined")')
    if level == "baseline":
        return out
    if bad := [c for c in cs if sc[id(c)].get("allowPrivilegeEscalation") is not False]:
        out.append(f"allowPrivilegeEscalation != false ({_must(bad, 'set securityContext.allowPrivilegeEscalation=false')})")
    drops = {id(c): set((sc[id(c)].get("capabilities") or {}).get("drop") or []) for c in cs}
    if bad := [c for c in cs if "ALL" not in drops[id(c)] or added[id(c)] - {"NET_BIND_SERVICE"}]:
        fix = _must(bad, 'set securityContext.capabilities.drop=["ALL"]')
        out.append(f"unrestricted capabilities ({fix})")
    if bad := [v["name"] for v in spec.get("volumes") or [] if not (set(v) - {"name"}) <= _RESTRICTED_VOLUMES]:
        out.append("restricted volume types (" + ", ".join(f'volume "{n}"' for n in bad) + ")")
    explicit_false = [c for c in cs if sc[id(c)].get("runAsNonRoot") is False]
    unset = [c for c in cs if sc[id(c)].get("runAsNonRoot") is not True]
    if explicit_false:
        out.append(f"runAsNonRoot != true ({_must(explicit_false, 'not set securityContext.runAsNonRoot=false')})")
    elif psc.get("runAsNonRoot") is not True and unset:
        out.append(f"runAsNonRoot != true (pod or {_must(unset, 'set securityContext.runAsNonRoot=true')})")
    if psc.get("runAsUser") == 0 or any(sc[id(c)].get("runAsUser") == 0 for c in cs):
        out.append("runAsUser=0 (pod and containers must not set runAsUser=0)")
    ok = ("RuntimeDefault", "Localhost")
    pod_ok = (psc.get("seccompProfile") or {}).get("type") in ok
    if bad := [c for c in cs if not (seccomp[id(c)] in ok or (pod_ok and seccomp[id(c)] is None))]:
        fix = _must(bad, 'set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost"')
        out.append(f"seccompProfile (pod or {fix})")
    return out
