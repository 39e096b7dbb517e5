"""Sandboxes: where each rollout runs. One interface (`openforge.sandbox.base`), one module per backend
(`local`, `docker`, `kubernetes`), and `make_sandbox(config)` to pick one by `sandbox.type`.
`docker_engine.connect` is the one way to a Docker engine (the backend, image builds, the sweeper).
`confine` runs a task's own processes (its services, MCP servers, tool commands) on the host in a
bubblewrap sandbox of their own, with no more reach than the agent's."""

from openforge.sandbox.base import (ExecResult, IsolationReport, IsolationUnavailable, Sandbox, SandboxBase,
                          SandboxFileNotFound, SandboxInfo, SandboxStartFailed, TransientSandboxError,
                          sandbox_labels, start_with_retry, stop_shielded)
from openforge.sandbox.factory import isolation_check, make_sandbox

__all__ = ["ExecResult", "IsolationReport", "IsolationUnavailable", "Sandbox", "SandboxBase", "SandboxFileNotFound",
           "SandboxInfo", "SandboxStartFailed", "TransientSandboxError", "isolation_check", "make_sandbox",
           "sandbox_labels", "start_with_retry", "stop_shielded"]
