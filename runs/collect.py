"""`forge collect` without the CLI: SFT data by rejection sampling. A teacher (`engine.kind = "remote"`,
or any engine) drives the harness on a task set, k samples a task, through the same runner, sandboxes
and graders as `forge eval` and RL; the rollouts scored at least `min_reward` are the ones `forge sft
--from RUN` trains on.

    run, counts = collect(store, config, home=home, min_reward=1.0)     # a run of kind collect
    run, counts = collect(store, config, home=home, min_reward=1.0, resume=run.id)

A resumed collection runs with the run's stored config and samples only what it lacks: a (task,
harness, sample) already scored is not sampled again; one that failed, was cancelled or interrupted is.
The counts (scored and kept rollouts per task and per harness) are the run's summary.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from openforge.config import ForgeConfig, stored_config
from openforge.errors import ConfigError
from openforge.rollouts.runner.evaluate import eval_specs
from openforge.rollouts.runner.failures import PromptDoesNotFit, StepFailed
from openforge.runs.evaluate import cancel_on_sigterm
from openforge.runs.prepare import isolation_for, load_run_tasks, preflight, resolve_model
from openforge.runs.stack import Stack
from openforge.store import Rollout, Run, Store


def collect_counts(store: Store, run_id: str, min_reward: float) -> dict[str, Any]:
    """{"rollouts": scored, "kept": reaching min_reward, "kept_by_task": {task: {"scored", "kept"}},
    "kept_by_harness": {harness: {"scored", "kept"}}} over the run's scored rollouts."""
    out: dict[str, Any] = {"min_reward": min_reward, "rollouts": 0, "kept": 0, "kept_by_task": {},
                           "kept_by_harness": {}}
    for r in store.list_rollouts(run_id):
        if r.status != "scored" or r.reward is None:
            continue
        kept = int(r.reward >= min_reward)
        out["rollouts"] += 1
        out["kept"] += kept
        for table, key in (("kept_by_task", r.task_id), ("kept_by_harness", r.harness)):
            tally = out[table].setdefault(key, {"scored": 0, "kept": 0})
            tally["scored"] += 1
            tally["kept"] += kept
    return out


def collect(store: Store, config: ForgeConfig, *, home: Path, min_reward: float, name: str = "",
            resume: str | None = None, on_start: Callable[[ForgeConfig, str, int], Any] | None = None,
            on_progress: Callable[[Rollout], Any] | None = None) -> tuple[Run, dict[str, Any]]:
    """Sample every task of `config.tasks` `runner.samples_per_task` times in each harness (or what run
    `resume` lacks of that); return the run and its counts. KeyboardInterrupt when cancelled."""
    run = store.get_run(resume) if resume is not None else None
    if run is not None:
        if run.kind != "collect":
            raise ConfigError(f"run {run.id} is of kind {run.kind}; --resume continues a forge collect run")
        config = stored_config(run.config_json or {})
    preflight(config, home)
    model = str(resolve_model(config, home))  # the student: its tokenizer records a teacher's calls
    config = config.model_copy(update={"engine": config.engine.model_copy(update={"model": model})})
    tasks = load_run_tasks(config)
    harnesses = list(config.harness.weights()) if config.harness.names else [""]
    specs = eval_specs(tasks, config.runner.samples_per_task, harnesses)
    if run is None:
        run = store.create_run(kind="collect", name=name or config.name, config=config.model_dump(mode="json"),
                               owner_pid=os.getpid())
    else:
        done = {(r.task_id, r.harness, r.sample_index) for r in store.list_rollouts(run.id) if r.status == "scored"}
        one = config.harness.name  # the harness name a "" spec runs in
        specs = [s for s in specs if (s.task.id, s.harness or one, s.sample_index) not in done]
        store.update_run(run.id, owner_pid=os.getpid(), error=None, ended_at=None)
    store.set_run_status(run.id, "running")
    store.update_run(run.id, isolation=isolation_for(config))
    try:
        with Stack(config, store) as stack:
            if on_start is not None:
                on_start(config, stack.proxy_url, len(specs))
            if specs:
                asyncio.run(cancel_on_sigterm(_sample(store, config, run.id, specs, proxy_url=stack.proxy_url,
                                                       proxy_socket=stack.proxy_socket, on_progress=on_progress)))
    except (asyncio.CancelledError, KeyboardInterrupt):
        store.set_run_status(run.id, "stopped", error="cancelled")
        store.interrupt_unfinished(run.id)
        raise KeyboardInterrupt from None
    except Exception as exc:
        store.set_run_status(run.id, "failed", error=str(exc) or type(exc).__name__)
        raise
    counts = collect_counts(store, run.id, min_reward)
    store.update_run(run.id, summary={"kind": "collect", "samples": config.runner.samples_per_task, **counts})
    try:  # as eval: a collection whose every rollout failed for infra or harness reasons says why
        rollouts = store.list_rollouts(run.id)
        PromptDoesNotFit.check(f"collect {run.id}", rollouts)  # the harness's prompt over the context: its fix
        StepFailed.check(f"collect {run.id}", rollouts)
    except (StepFailed, PromptDoesNotFit) as exc:
        store.set_run_status(run.id, "failed", error=str(exc))
        raise
    return store.set_run_status(run.id, "finished"), counts


async def _sample(store: Store, config: ForgeConfig, run_id: str, specs: list[Any], *, proxy_url: str,
                  proxy_socket: str | None, on_progress: Callable[[Rollout], Any] | None) -> None:
    from openforge.rollouts.runner.runner import RolloutRunner

    runner = RolloutRunner(store, config=config, proxy_url=proxy_url, on_progress=on_progress,
                           proxy_socket=proxy_socket)
    await runner.run(run_id, specs)
