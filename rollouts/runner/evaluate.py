"""An eval: every task of a set sampled k times through a harness, scored, summarised and stored.

The run is a `Run` of kind "eval" whose `summary_json` holds the metrics table (see metrics.py), so
`forge show RUN` and the dashboard read it back. Engine and proxy are the caller's: it passes the
proxy's URL (forge_cli starts both, as `forge proxy` does).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from typing import Any

from openforge.config import ForgeConfig
from openforge.store import Rollout, Run, Store
from openforge.rollouts.harnesses.base import Harness
from openforge.rollouts.runner.metrics import RunMetrics, summarize_run
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import TaskSpec


def eval_specs(tasks: Sequence[TaskSpec], samples: int) -> list[RolloutSpec]:
    """Task-major order: a task's k samples start together, so its group finishes together."""
    return [RolloutSpec(task, i) for task in tasks for i in range(samples)]


async def run_eval(store: Store, config: ForgeConfig, tasks: Sequence[TaskSpec], *, proxy_url: str,
                   samples: int, k_values: Sequence[int], name: str = "", adapter: str | None = None,
                   harness: Harness | None = None,
                   on_progress: Callable[[Rollout], Any] | None = None,
                   on_runner: Callable[[RolloutRunner], Any] | None = None,
                   proxy_socket: str | None = None) -> tuple[Run, RunMetrics]:
    """Create the eval run, run every rollout, store the summary. `on_runner` gets the runner (for pause)."""
    run = store.create_run(kind="eval", name=name, config=config.model_dump(mode="json"), owner_pid=os.getpid())
    store.set_run_status(run.id, "running")
    runner = RolloutRunner(store, config=config, proxy_url=proxy_url, harness=harness, on_progress=on_progress,
                           proxy_socket=proxy_socket)
    if on_runner is not None:
        on_runner(runner)
    try:
        await runner.run(run.id, eval_specs(tasks, samples), adapter=adapter)
    except asyncio.CancelledError:
        store.set_run_status(run.id, "stopped", error="cancelled")
        raise
    except Exception as exc:
        store.set_run_status(run.id, "failed", error=f"{type(exc).__name__}: {exc}")
        raise
    metrics = summarize_run(store, run.id, [k for k in k_values if k >= 1])
    store.update_run(run.id, summary={"kind": "eval", "samples": samples, **metrics.to_json()})
    return store.set_run_status(run.id, "finished"), metrics
