"""A task's own resource needs, which replace the run's sandbox limits for that task's rollouts.

Harbor's task.toml declares them per task (`[environment] cpus / memory_mb / storage_mb`, harbor
`EnvironmentConfig`); a task built for 4 cores and 8 GB is not graded fairly in a sandbox sized for
another. Each backend says how it honours them (`SandboxBase.with_limits`):

| need       | local (bubblewrap)                           | docker                        | kubernetes                        |
|------------|----------------------------------------------|-------------------------------|-----------------------------------|
| cpus       | CPU affinity: ceil(cpus) of this host's cores | `--cpus` (at most the host's)  | cpu request = limit               |
| memory_mb  | the sandbox's cgroup (else RLIMIT_DATA)       | `--memory` (no swap above it) | memory request = limit            |
| storage_mb | RLIMIT_FSIZE: no file may outgrow it          | `--ulimit fsize`: the same    | ephemeral-storage request = limit |

Neither local nor docker has a quota on the total written (the writable folders are a directory and
Docker volumes): storage caps each file, which bounds what one runaway write can fill. Docker's own
size option (`storage_opt`) needs overlay2 on xfs with project quotas (this machine's engine runs
overlay2 on ext4) and would cap only the container's layer, read-only here; a size-capped tmpfs is not
seeded from a task image's WORKDIR and its pages count against the memory limit. Kubernetes' limit is
the kubelet's eviction, not a refused write. So forge says what storage_mb is on the chosen backend in
one line (`storage_notice`: `forge tasks validate`, `forge tasks import harbor`) rather than call it a quota.
"""

from __future__ import annotations

import math
import os

from pydantic import BaseModel, ConfigDict, Field


class TaskLimits(BaseModel):
    """A task's resource needs (TaskSpec.limits); a field left out keeps the run's sandbox setting."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: float | None = Field(None, gt=0, description="cores the task's sandbox may use")
    memory_mb: int | None = Field(None, ge=16, description="memory of the task's sandbox, in MB")
    storage_mb: int | None = Field(None, ge=1, description="disk a file of the task's sandbox may take, in MB")


def storage_notice(task_ids: list[str], sandbox_type: str | None) -> str | None:
    """The one line saying what the storage_mb that `task_ids` declare is on `sandbox_type`'s backend (each
    backend's `storage_enforced_as`; every loadable backend when None); None when no task declares it."""
    from openforge.sandbox.factory import BACKENDS, sandbox_class

    if not task_ids:
        return None
    named = ", ".join(task_ids[:3]) + (f" and {len(task_ids) - 3} more" if len(task_ids) > 3 else "")
    types = [sandbox_type] if sandbox_type else list(BACKENDS)
    ways = []
    for name in types:
        try:
            ways.append(f"on {name}, {sandbox_class(name).storage_enforced_as}")
        except Exception:  # noqa: BLE001 - a backend whose SDK is not installed: nothing to say of it
            continue
    return f"note: {len(task_ids)} task(s) declare storage_mb ({named}); it is not a disk quota: {'; '.join(ways)}"


def host_cpus() -> int:
    """The cores this process may run on (its affinity, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def affinity_cores(cpus: float) -> int:
    """Whole cores for a CPU need on a backend that pins rather than throttles: 1.5 -> 2, capped at the host's."""
    return max(1, min(math.ceil(cpus), host_cpus()))
