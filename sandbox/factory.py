"""`make_sandbox(config)`: the one place that knows which class each `sandbox.type` names.

Each backend is imported only when asked for, so `forge` starts fast and runs without the docker or
kubernetes SDKs until a config selects them.
"""

from __future__ import annotations

from openforge.config import SandboxConfig
from openforge.errors import SandboxError
from sandbox.base import Sandbox


def make_sandbox(config: SandboxConfig, *, run_id: str, rollout_id: str) -> Sandbox:
    """A not-yet-started sandbox of the configured backend; use it as `async with make_sandbox(...) as sb`."""
    if config.type == "local":
        from sandbox.local import LocalSandbox

        return LocalSandbox(config, run_id=run_id, rollout_id=rollout_id)
    if config.type == "docker":
        from sandbox.docker import DockerSandbox

        return DockerSandbox(config, run_id=run_id, rollout_id=rollout_id)
    if config.type == "kubernetes":
        try:
            from sandbox.kubernetes import KubernetesSandbox
        except ImportError as exc:
            raise SandboxError(f"the kubernetes backend cannot be loaded ({exc}); pip install 'openforge[k8s]'") from None
        return KubernetesSandbox(config, run_id=run_id, rollout_id=rollout_id)
    raise SandboxError(f"unknown sandbox.type {config.type!r}; choose local, docker or kubernetes")
