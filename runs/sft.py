"""`forge sft`: one supervised fine-tuning run (kind `sft`) on the kept rollouts of earlier runs.

    run row (kind sft, status running) -> kept trajectories (reward >= min_reward) -> trainer/sft.py
        -> adapter under runs/<run>/adapters/step-N -> summary, finished (or failed, with the reason)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from openforge.config import ForgeConfig
from openforge.errors import ForgeError
from openforge.runs.prepare import resolve_model
from openforge.store import Run, Store, TrainStep
from openforge.trainer.sft import SftResult, select_examples, train_sft


def kept_threshold(run: Run, min_reward: float | None) -> float:
    """The reward a rollout of `run` needs to be trained on: `min_reward`, else the threshold its
    `forge collect` counted with, else 1.0 (a passed task)."""
    if min_reward is not None:
        return min_reward
    return float((run.summary_json or {}).get("min_reward", 1.0)) if run.kind == "collect" else 1.0


def run_sft(store: Store, home: Path, config: ForgeConfig, *, sources: Sequence[str], min_reward: float | None,
            epochs: int, val_tasks: int = 1, on_step: Callable[[TrainStep], Any] | None = None
            ) -> tuple[str, SftResult]:
    """Train the student (`engine.model`, or the tiny model) on the rollouts of `sources` scored at
    least `min_reward` (None: `kept_threshold`'s); returns the run id and what it did. A failure ends
    the run `failed`, re-raised."""
    thresholds = {run.id: kept_threshold(run, min_reward) for run in (store.get_run(r) for r in sources)}
    run_ids = list(thresholds)
    model = resolve_model(config, home)
    run = store.create_run(kind="sft", name=config.name, config=config.model_dump(mode="json"), owner_pid=os.getpid())
    store.set_run_status(run.id, "running")
    try:
        examples = [e for rid, bar in thresholds.items() for e in select_examples(store, [rid], min_reward=bar)]
        result = train_sft(store, home, run.id, model_path=model, examples=examples, cfg=config.trainer,
                           epochs=epochs, max_tokens=config.sft.max_tokens, val_tasks=val_tasks, on_step=on_step)
    except (ForgeError, KeyboardInterrupt) as exc:
        store.set_run_status(run.id, "stopped" if isinstance(exc, KeyboardInterrupt) else "failed",
                             error=str(exc) or type(exc).__name__)
        raise
    store.update_run(run.id, summary={
        "sources": run_ids, "min_reward": thresholds, "epochs": epochs, "steps": result.steps,
        "train_sequences": result.n_train, "val_sequences": result.n_val,
        "train_loss_first": result.train_losses[0], "train_loss_last": result.train_losses[-1],
        "val_losses": result.val_losses, "adapter": str(result.adapter_path), "model": str(model)})
    store.set_run_status(run.id, "finished")
    return run.id, result
