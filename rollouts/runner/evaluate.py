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
from openforge.rollouts.analysis.eval_figures import compare_runs, harness_figures, to_json
from openforge.rollouts.harnesses.base import Harness
from openforge.rollouts.runner.metrics import RunMetrics, summarize_run
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import TaskSpec
from openforge.rollouts.tasks.kinds import kinds_of


def eval_specs(tasks: Sequence[TaskSpec], samples: int, harnesses: Sequence[str] = ("",)) -> list[RolloutSpec]:
    """A group of k samples of each task in each harness (`harness.names`; "" = the run's only one).
    Task-major order: a task's k samples start together, so its group finishes together."""
    return [RolloutSpec(task, i, harness) for task in tasks for harness in harnesses for i in range(samples)]


def group_specs(tasks: Sequence[TaskSpec], samples: int, harnesses: Sequence[str]) -> list[RolloutSpec]:
    """One group of k samples per task, the i-th task's in `harnesses[i]` (rollouts/runner/mix.py)."""
    return [RolloutSpec(task, i, harness) for task, harness in zip(tasks, harnesses, strict=True)
            for i in range(samples)]


async def run_eval(store: Store, config: ForgeConfig, tasks: Sequence[TaskSpec], *, proxy_url: str,
                   samples: int, k_values: Sequence[int], name: str = "", adapter: str | None = None,
                   harness: Harness | None = None,
                   on_progress: Callable[[Rollout], Any] | None = None,
                   on_runner: Callable[[RolloutRunner], Any] | None = None,
                   proxy_socket: str | None = None, compare_with: str | None = None) -> tuple[Run, RunMetrics]:
    """Create the eval run, run every rollout, store the summary. `on_runner` gets the runner (for pause).
    `compare_with`: an earlier eval run's id; the summary holds this run's figures less its, paired by task."""
    run = store.create_run(kind="eval", name=name, config=config.model_dump(mode="json"), owner_pid=os.getpid())
    store.set_run_status(run.id, "running")
    runner = RolloutRunner(store, config=config, proxy_url=proxy_url, harness=harness, on_progress=on_progress,
                           proxy_socket=proxy_socket)
    if on_runner is not None:
        on_runner(runner)
    try:
        harnesses = list(config.harness.weights()) if config.harness.names else [""]
        await runner.run(run.id, eval_specs(tasks, samples, harnesses), adapter=adapter)
    except asyncio.CancelledError:
        store.set_run_status(run.id, "stopped", error="cancelled")
        raise
    except Exception as exc:
        store.set_run_status(run.id, "failed", error=f"{type(exc).__name__}: {exc}")
        raise
    ks = [k for k in k_values if k >= 1]
    metrics = summarize_run(store, run.id, ks)
    summary = {"kind": "eval", "samples": samples, **metrics.to_json()}
    if config.harness.names:  # each harness's figures beside the run's (every task ran in each)
        summary["by_harness"] = {name: summarize_run(store, run.id, ks, harness=name).to_json()
                                 for name in {r.harness for r in store.list_rollouts(run.id) if r.harness}}
    # Every harness's pass@k and pass^k with 95% bootstrap intervals over tasks (rollouts/analysis/eval_figures.py)
    summary["harness_figures"] = to_json(harness_figures(store, run.id, ks))
    if compare_with is not None:
        summary["compare"] = {"run": compare_with, "by_harness": to_json(compare_runs(store, run.id, compare_with, ks))}
    for kind, _ in kinds_of(tasks).values():  # a family's own figures (ClawEval's), beside forge's
        summary |= kind.run_figures(store, run.id)
    store.update_run(run.id, summary=summary)
    return store.set_run_status(run.id, "finished"), metrics
