"""sandbox/limits.py: a task's own resource needs (TaskLimits), the cores a pinning backend gives a CPU need, and
the one line saying storage_mb is no disk quota. (Each backend honouring them is
tests/rollouts/tasks/harbor/test_tasks_harbor_limits.py's.)"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from openforge.sandbox.limits import TaskLimits, affinity_cores, host_cpus, storage_notice


def test_a_need_must_be_positive_and_a_field_left_out_keeps_the_runs_setting() -> None:
    limits = TaskLimits(cpus=1.5, memory_mb=512)
    assert (limits.cpus, limits.memory_mb, limits.storage_mb) == (1.5, 512, None)
    for bad in ({"cpus": 0}, {"memory_mb": 8}, {"storage_mb": 0}, {"disk_mb": 5}):
        with pytest.raises(ValidationError):
            TaskLimits.model_validate(bad)


def test_a_cpu_need_rounds_up_to_whole_cores_capped_at_the_hosts() -> None:
    assert host_cpus() >= 1
    assert affinity_cores(0.2) == 1
    assert affinity_cores(1.5) == min(2, host_cpus())
    assert affinity_cores(10_000) == host_cpus()


def test_storage_mb_is_said_once_for_the_tasks_that_declare_it() -> None:
    assert storage_notice([], "local") is None
    line = storage_notice(["a", "b", "c", "d", "e"], "local")
    assert line.startswith("note: 5 task(s) declare storage_mb (a, b, c and 2 more); it is not a disk quota: on local, ")
    assert "on docker" not in line
