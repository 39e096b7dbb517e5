"""What the task-import benches share: `forge tasks validate --run` (rollouts/tasks/selfcheck.py) over an
imported set in a fresh FORGE_HOME, its wall time and each task's problems. Used by bench/harbor_import.py
and bench/osworld_import.py."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any


async def validate_run(records: list[dict], config: Any = None) -> tuple[list[Any], float, dict[str, list[str]]]:
    """(the TaskSpecs, wall seconds of the self-check, task id -> its problems' messages) of `records`, each
    task's reference solution and hostile answers run under `config` (default: ForgeConfig())."""
    from openforge.config import ForgeConfig
    from openforge.rollouts.tasks.format import TaskSpec
    from openforge.rollouts.tasks.selfcheck import check_solutions
    from openforge.store import Store

    tasks = [TaskSpec.model_validate(r) for r in records]
    with tempfile.TemporaryDirectory() as home:
        os.environ["FORGE_HOME"] = home
        store = Store(Path(home) / "forge.db")
        t0 = time.perf_counter()
        problems = await check_solutions(store, config or ForgeConfig(), tasks)
        wall = time.perf_counter() - t0
        store.close()
    by_task: dict[str, list[str]] = {}
    for p in problems:
        by_task.setdefault(p.task_id or "", []).append(p.message)
    return tasks, wall, by_task
