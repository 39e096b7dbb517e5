"""Sandboxes: where each rollout runs. One interface (`sandbox.base`), one module per backend
(`local`, `docker`, `kubernetes`), and `make_sandbox(config)` to pick one by `sandbox.type`."""

from sandbox.base import (ExecResult, Sandbox, SandboxBase, SandboxFileNotFound, SandboxInfo,
                          TransientSandboxError, sandbox_labels)
from sandbox.factory import make_sandbox

__all__ = ["ExecResult", "Sandbox", "SandboxBase", "SandboxFileNotFound", "SandboxInfo",
           "TransientSandboxError", "make_sandbox", "sandbox_labels"]
