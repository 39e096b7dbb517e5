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
Docker volumes): storage caps each file, which bounds what one runaway write can fill.
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


def host_cpus() -> int:
    """The cores this process may run on (its affinity, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def affinity_cores(cpus: float) -> int:
    """Whole cores for a CPU need on a backend that pins rather than throttles: 1.5 -> 2, capped at the host's."""
    return max(1, min(math.ceil(cpus), host_cpus()))
