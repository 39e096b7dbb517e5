"""`make_sandbox(config)`: the one place that knows which class each `sandbox.type` names, and
`isolation_check(config)`: what will keep this run's rollouts in, checked before a run starts.

Each backend is imported only when asked for, so `forge` starts fast and runs without the docker or
kubernetes SDKs until a config selects them.
"""

from __future__ import annotations

from pathlib import Path

from openforge.config import SandboxConfig
from openforge.errors import SandboxError
from openforge.sandbox.base import IsolationReport, IsolationUnavailable, Sandbox


def make_sandbox(config: SandboxConfig, *, run_id: str, rollout_id: str,
                 proxy_socket: str | Path | None = None, site_socket: str | Path | None = None) -> Sandbox:
    """A not-yet-started sandbox of the configured backend; use it as `async with make_sandbox(...) as sb`.

    `proxy_socket`: the proxy's unix socket on the host, bound into the sandbox; a harness inside then
    reaches the proxy at `sb.proxy_url` (local with bubblewrap, and docker with network "none").
    `site_socket`: a GUI task's site socket (rollouts/tasks/web/server.py), which a container binds when it is
    created; local sandboxes bind it per exec from `attach_gui(spec)` and Kubernetes pods get it from
    the spec too, so only docker takes it here."""
    if config.type == "local":
        from openforge.sandbox.local import LocalSandbox

        return LocalSandbox(config, run_id=run_id, rollout_id=rollout_id, proxy_socket=proxy_socket)
    if config.type == "docker":
        from openforge.sandbox.docker import DockerSandbox

        return DockerSandbox(config, run_id=run_id, rollout_id=rollout_id, proxy_socket=proxy_socket,
                             site_socket=site_socket)
    if config.type == "kubernetes":
        try:
            from openforge.sandbox.kubernetes import KubernetesSandbox
        except ImportError as exc:
            raise SandboxError(f"the kubernetes backend cannot be loaded ({exc}); pip install 'openforge[k8s]'") from None
        return KubernetesSandbox(config, run_id=run_id, rollout_id=rollout_id)
    raise SandboxError(f"unknown sandbox.type {config.type!r}; choose local, docker or kubernetes")


def isolation_check(config: SandboxConfig) -> IsolationReport:
    """What isolates rollouts under this config here; `IsolationUnavailable` (with the fix) when the
    local backend cannot isolate and the user has not chosen `isolation = "none"` explicitly.

    Container backends are isolated by construction; whether their engine is reachable is a separate
    preflight check."""
    if config.type == "docker":
        return IsolationReport("docker", f"containers with network {config.network!r}")
    if config.type == "kubernetes":
        return IsolationReport("kubernetes", f"pods in namespace {config.namespace}")
    if config.isolation == "none":
        return IsolationReport("none", 'sandbox.isolation = "none": rollouts run as plain host processes')
    from openforge.sandbox.local import ISOLATION_FIX, bwrap_usable

    path = bwrap_usable()
    if not path:
        raise IsolationUnavailable(ISOLATION_FIX)
    return IsolationReport("bwrap-userns", f"{path}: user, pid, net, ipc, uts, cgroup namespaces, no capabilities")
