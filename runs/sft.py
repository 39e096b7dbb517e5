"""`forge sft`: one supervised fine-tuning run (kind `sft`) on the kept rollouts of earlier runs.

    run row (kind sft, status running) -> kept trajectories (reward >= min_reward) -> trainer/sft.py
        -> a checkpoint each epoch, runs/<run>/adapters/step-N -> summary, finished (or failed, with the reason)

`forge sft --resume RUN` continues a failed, stopped or interrupted run from its last checkpoint;
`--nproc N` runs the training on N ranks under torchrun (trainer/sft_ranks.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from openforge.config import ForgeConfig, stored_config
from openforge.errors import ConfigError, ForgeError
from openforge.runs.prepare import mark_dead_runs, resolve_model
from openforge.store import RUN_FINAL, Run, Store, TrainStep
from openforge.trainer import launch
from openforge.trainer.checkpoint import latest_checkpoint
from openforge.trainer.sft import SftResult, select_examples, train_sft


def sft_elsewhere(nproc: int, rank_argv: Callable[[int], list[str]]) -> int | None:
    """Whether the run is this process's: None when it is (one process, or rank 0 under torchrun).
    Otherwise the exit status once done elsewhere: a torchrun rank other than 0 trains with rank 0
    (trainer/sft_ranks.py), and with `nproc` > 1 outside torchrun the same command (`rank_argv`) runs
    on `nproc` ranks, FSDP2 across them."""
    if launch.is_follower():
        from openforge.trainer.sft import follow

        follow()
        return 0
    if nproc > 1 and not launch.under_torchrun():
        return launch.relaunch(nproc, rank_argv(nproc))
    return None


def kept_threshold(run: Run, min_reward: float | None) -> float:
    """The reward a rollout of `run` needs to be trained on: `min_reward`, else the threshold its
    `forge collect` counted with, else 1.0 (a passed task)."""
    if min_reward is not None:
        return min_reward
    return float((run.summary_json or {}).get("min_reward", 1.0)) if run.kind == "collect" else 1.0


def run_sft(store: Store, home: Path, config: ForgeConfig, *, sources: Sequence[str], min_reward: float | None,
            epochs: int, val_tasks: int = 0, on_step: Callable[[TrainStep], Any] | None = None,
            resume: str | None = None) -> tuple[str, SftResult]:
    """Train the student (`engine.model`, or the tiny model) on the rollouts of `sources` scored at
    least `min_reward` (None: `kept_threshold`'s); returns the run id and what it did. `resume`
    continues an sft run from its last checkpoint with its stored config, sources, thresholds and
    epochs (the other arguments are ignored). A failure ends the run `failed`, re-raised."""
    resumed = None
    if resume is None:
        thresholds = {run.id: kept_threshold(run, min_reward) for run in (store.get_run(r) for r in sources)}
        model = resolve_model(config, home)  # a bad engine.model is one line before the run exists
        run = store.create_run(kind="sft", name=config.name, config=config.model_dump(mode="json"),
                               owner_pid=os.getpid())
    else:
        run = _reopen(store, resume)
        config = stored_config(run.config_json or {})
        plan = run.summary_json or {}
        if "val_tasks" not in plan:
            raise ConfigError(f"run {run.id} holds no plan to resume (it began before forge sft could resume): "
                              "start a new forge sft")
        thresholds, epochs, val_tasks = plan["min_reward"], plan["epochs"], plan["val_tasks"]
        model = resolve_model(config, home)
        resumed = latest_checkpoint(home, run.id)
        store.drop_train_steps_after(run.id, resumed.step if resumed else 0)
    # What a resume needs to redo the same run, stored before the first step.
    plan = {"sources": list(thresholds), "min_reward": thresholds, "epochs": epochs, "val_tasks": val_tasks}
    store.update_run(run.id, summary=plan)
    store.set_run_status(run.id, "running")
    try:
        examples = [e for rid, bar in thresholds.items() for e in select_examples(store, [rid], min_reward=bar)]
        cfg = config.trainer.model_copy(update={"lr": config.sft.lr})  # SFT's rate, [trainer]'s everything else
        result = train_sft(store, home, run.id, model_path=model, examples=examples, cfg=cfg,
                           epochs=epochs, max_tokens=config.sft.max_tokens, val_tasks=val_tasks, on_step=on_step,
                           resumed=resumed)
    except (ForgeError, KeyboardInterrupt) as exc:
        store.set_run_status(run.id, "stopped" if isinstance(exc, KeyboardInterrupt) else "failed",
                             error=str(exc) or type(exc).__name__)
        raise
    store.update_run(run.id, summary={
        **plan, "steps": result.steps, "train_sequences": result.n_train, "val_sequences": result.n_val,
        "train_loss_first": result.train_losses[0], "train_loss_last": result.train_losses[-1],
        "val_losses": result.val_losses, "adapter": str(result.adapter_path), "model": str(model)})
    store.set_run_status(run.id, "finished")
    return run.id, result


def _reopen(store: Store, run_id: str) -> Run:
    """The sft run `run_id`, to continue: ConfigError for another kind, a finished one, or one still driven."""
    mark_dead_runs(store)
    run = store.get_run(run_id)
    if run.kind != "sft":
        raise ConfigError(f"run {run.id} is of kind {run.kind}; --resume continues a forge sft run")
    if run.status == "finished":
        raise ConfigError(f"run {run.id} is finished: nothing to resume")
    if run.status not in RUN_FINAL:
        raise ConfigError(f"run {run.id} is {run.status} (driven by pid {run.owner_pid}); "
                          f"stop it first with `forge stop {run.id}`")
    store.update_run(run.id, owner_pid=os.getpid(), error=None, ended_at=None)
    return run
