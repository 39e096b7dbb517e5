"""`make_sandbox(config)`: the one place that knows which class each `sandbox.type` names (`BACKENDS`),
and `isolation_check(config)`: what will keep this run's rollouts in, checked before a run starts.

Each backend is imported only when asked for, so `forge` starts fast and runs without the docker or
kubernetes SDKs until a config selects them. A new backend is one entry in `BACKENDS` (and its config
in openforge/config.py's union): what differs between backends is declared on its class
(sandbox/base.py), so nothing else needs an edit.
"""

from __future__ import annotations

from pathlib import Path

from openforge.config import SandboxConfig
from openforge.errors import SandboxError
from openforge.lazy import lazy_class
from openforge.sandbox.base import IsolationReport, Sandbox, SandboxBase

# sandbox.type -> (module, class), imported lazily
BACKENDS: dict[str, tuple[str, str]] = {
    "local": ("openforge.sandbox.local", "LocalSandbox"),
    "docker": ("openforge.sandbox.docker", "DockerSandbox"),
    "kubernetes": ("openforge.sandbox.kubernetes", "KubernetesSandbox"),
}
# What to install when a backend's module cannot be imported.
INSTALL_HINTS: dict[str, str] = {"kubernetes": "pip install 'kubernetes>=37,<38'", "docker": "pip install docker"}


def sandbox_class(sandbox_type: str) -> type[SandboxBase]:
    """The backend class `sandbox.type` names; SandboxError for an unknown or unloadable one."""
    entry = BACKENDS.get(sandbox_type)
    if entry is None:
        raise SandboxError(f"unknown sandbox.type {sandbox_type!r}; choose {', '.join(BACKENDS)}")
    try:
        return lazy_class(*entry)
    except ImportError as exc:
        hint = INSTALL_HINTS.get(sandbox_type, "check its dependencies")
        raise SandboxError(f"the {sandbox_type} backend cannot be loaded ({exc}); {hint}") from None


def make_sandbox(config: SandboxConfig, *, run_id: str, rollout_id: str,
                 proxy_socket: str | Path | None = None, site_socket: str | Path | None = None) -> Sandbox:
    """A not-yet-started sandbox of the configured backend; use it as `async with make_sandbox(...) as sb`.

    `proxy_socket`: the proxy's unix socket on the host, bound into the sandbox; a harness inside then
    reaches the proxy at `sb.agent_proxy_url(...)` (local with bubblewrap, and docker with network "none").
    `site_socket`: a GUI task's site socket (rollouts/tasks/web/server.py), which a container binds when it is
    created; local sandboxes bind it per exec from `attach_gui(spec)` and Kubernetes pods get it from
    the spec too. Every backend's constructor takes both (the signature `SandboxBase` documents)."""
    return sandbox_class(config.type)(config, run_id=run_id, rollout_id=rollout_id, proxy_socket=proxy_socket,
                                      site_socket=site_socket)


def isolation_check(config: SandboxConfig) -> IsolationReport:
    """What isolates rollouts under this config here; `IsolationUnavailable` (with the fix) when the
    local backend cannot isolate and the user has not chosen `isolation = "none"` explicitly.

    Container backends are isolated by construction; whether their engine is reachable is a separate
    preflight check."""
    return sandbox_class(config.type).check_isolation(config)
