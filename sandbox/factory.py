"""`make_sandbox(config)` and `isolation_check(config)`: what the sandbox config builds and checks, for
callers that hold a config. The config does the work (openforge/config.py: each backend's config builds
its backend, as SWE-ReX's deployment configs do, from `SANDBOX_BACKENDS`, the one table of which class each
`sandbox.type` names).

Each backend is imported only when asked for, so `forge` starts fast and runs without the docker or
kubernetes SDKs until a config selects them. A new backend is one entry in `BACKENDS` (and its config
in openforge/config.py's union): what differs between backends is declared on its class
(sandbox/base.py) and its config, so nothing else needs an edit.
"""

from __future__ import annotations

from pathlib import Path

from openforge.config import SANDBOX_BACKENDS, SANDBOX_INSTALL_HINTS, SandboxConfig, sandbox_backend
from openforge.sandbox.base import IsolationReport, Sandbox, SandboxBase

BACKENDS = SANDBOX_BACKENDS  # sandbox.type -> (module, class), imported lazily
INSTALL_HINTS = SANDBOX_INSTALL_HINTS


def sandbox_class(sandbox_type: str) -> type[SandboxBase]:
    """The backend class `sandbox.type` names; SandboxError for an unknown or unloadable one."""
    return sandbox_backend(sandbox_type)


def make_sandbox(config: SandboxConfig, *, run_id: str, rollout_id: str,
                 proxy_socket: str | Path | None = None, site_socket: str | Path | None = None) -> Sandbox:
    """A not-yet-started sandbox of the configured backend; use it as `async with make_sandbox(...) as sb`.

    `proxy_socket`: the proxy's unix socket on the host, bound into the sandbox; a harness inside then
    reaches the proxy at `sb.agent_proxy_url(...)` (local with bubblewrap, and docker with network "none").
    `site_socket`: a GUI task's site socket (rollouts/tasks/web/server.py), which a container binds when it is
    created; local sandboxes bind it per exec from `attach_gui(spec)` and Kubernetes pods get it from
    the spec too. Every backend's constructor takes both (the signature `SandboxBase` documents)."""
    return config.get_sandbox(run_id=run_id, rollout_id=rollout_id, proxy_socket=proxy_socket, site_socket=site_socket)


def isolation_check(config: SandboxConfig) -> IsolationReport:
    """What isolates rollouts under this config here; `IsolationUnavailable` (with the fix) when the
    local backend cannot isolate and the user has not chosen `isolation = "none"` explicitly.

    Container backends are isolated by construction; whether their engine is reachable is a separate
    preflight check."""
    return config.backend().check_isolation(config)
