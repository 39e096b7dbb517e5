"""The training loop: sample -> train -> save the adapter -> hot-load it -> repeat.

    for step in range(start, steps):
        rollouts = sampler.sample(run, next tasks, step, adapter)      # engine serves the current adapter
        batch    = build_batch(rollouts, trajectories)                 # group advantages, drop failed groups
        metrics  = grpo_step(model, optimizer, micro_batches(batch))   # one update (or epochs_per_step)
        path     = save_checkpoint(...)                                # adapter + optimizer + rng + position
        engine.load_lora_adapter(name, path); run.current_adapter = name
        store.add_train_step(metrics)

Step N is done when its checkpoint exists; `train(..., resume=True)` starts after the newest one
(re-recording its metrics row if the kill came between checkpoint and row), so no step is lost or
repeated. Groups that had finished for steps not yet trained are trained as they are, within the
staleness bound (trainer/resume.py); unfinished ones are marked interrupted and sampled again. With
`trainer.init_from` the policy starts from that adapter (an SFT result), and the engine serves it to
step 0's rollouts.

With `max_staleness` K > 0 a `GroupBuffer` (trainer/buffer.py) samples groups continuously, each under
the adapter served when it starts, and phase 1 takes the next batch of finished groups instead; a
group is trained at most K adapter versions after the one that sampled it, which TIS corrects for along
with the engine/trainer mismatch. `trainer.overlap` is the name K = 1 had before (openforge/config.py).
"""

from __future__ import annotations

import hashlib
import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from openforge.config import TrainerConfig
from openforge.errors import TrainerError
from openforge.paths import forge_home
from openforge.store import Checkpoint, Store, TrainStep
from openforge.trainer import distributed
from openforge.trainer.checkpoint import (adapter_name, init_adapter_name, latest_checkpoint, save_checkpoint,
                                         set_rng_state)
from openforge.trainer.data import build_batch, call_sampling, micro_batches, version_metrics
from openforge.trainer.vision import TrajectoryImages
from openforge.trainer.grpo import StepConfig, grpo_step
from openforge.trainer.model import autocast_dtype, build_optimizer, build_policy, pad_token_id, pick_device
from openforge.trainer.adapter_sync import AdapterSync
from openforge.trainer.buffer import GroupBuffer, PartialRollouts
from openforge.trainer.resume import KeptGroups, kept_groups
from openforge.trainer.samplers import Sampler


class TaskStream:
    """An endless, seeded sequence of tasks: each pass over the set is a fresh shuffle.

    The position (tasks handed out so far) is all a checkpoint needs to continue it."""

    def __init__(self, tasks: Sequence[Any], seed: int) -> None:
        if not tasks:
            raise TrainerError("no tasks to train on")
        self.tasks, self.seed = list(tasks), seed
        ids = [str(_task_field(t, "id")) for t in self.tasks]
        self.fingerprint = hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]

    def take(self, position: int, n: int) -> list[Any]:
        out = []
        for pos in range(position, position + n):
            epoch, i = divmod(pos, len(self.tasks))
            order = list(range(len(self.tasks)))
            random.Random(f"{self.seed}-{epoch}").shuffle(order)
            out.append(self.tasks[order[i]])
        return out


@dataclass
class TrainResult:
    run_id: str
    steps: list[dict[str, Any]] = field(default_factory=list)  # metrics of the steps run by this call
    adapter: str | None = None  # the adapter the engine serves at the end


@dataclass
class _Policy:
    """What the loop updates: the model with its optimizer and schedule, and how to step it."""

    model: Any
    optimizer: Any
    scheduler: Any
    device: torch.device
    step_cfg: StepConfig
    pad_id: int
    group: Any = None  # under torchrun: the other ranks (trainer/distributed.py), driven from here

    def update(self, samples: Sequence[Any], config: TrainerConfig, trajectories: Sequence[Any] = (),
               vision: TrajectoryImages | None = None) -> dict[str, Any]:
        """One GRPO update on this step's samples: here, or sharded over every rank (image rows: the
        other ranks get the step's image bytes, from `trajectories`' image ids and `vision`'s store)."""
        if not samples:
            return {"n_tokens": 0}
        if self.group is not None:
            images = distributed.StepImages.of(samples, trajectories, vision.images) if vision is not None else None
            return self.group.step(self.model, self.optimizer, self.scheduler, list(samples), self.step_cfg, config,
                                   self.pad_id, images)
        mbs = micro_batches(samples, token_budget=config.micro_batch_tokens, pad_id=self.pad_id,
                            loss_agg=config.loss_agg, device=self.device, share_prefix_min=config.share_prefix_min_tokens)
        return grpo_step(self.model, self.optimizer, mbs, self.step_cfg, self.scheduler) if mbs else {"n_tokens": 0}

    def saveable(self) -> tuple[Any, Any]:
        """What save_checkpoint writes: the model and optimizer, or rank 0's gathered copy of them."""
        if self.group is not None:
            full = self.group.gather(self.model, self.optimizer)
            return full, full
        return self.model, self.optimizer

    def close(self) -> None:
        if self.group is not None:
            self.group.close()  # the other ranks exit


def _build(config: TrainerConfig, model_path: str | Path, found: Any) -> _Policy:
    if config.kl_coef > 0 and config.full_finetune:
        raise TrainerError("kl_coef > 0 needs LoRA: the reference is the base model with the adapter disabled")
    if config.rollout_versions > 1 and config.max_staleness == 0:
        raise TrainerError("trainer.rollout_versions > 1 moves running rollouts onto each new adapter: it needs "
                           "asynchronous training (trainer.max_staleness > 0)")
    d = distributed.init() if distributed.launched() else None
    if d is not None and config.full_finetune:
        raise TrainerError("trainer.nproc > 1 trains a LoRA adapter; full fine-tuning runs in one process")
    device = d.device if d is not None else pick_device(config.device)
    random.seed(config.seed)
    torch.manual_seed(config.seed)  # the LoRA init
    model = build_policy(model_path, config, device=device, resume_from=found.adapter_path if found else None)
    step_cfg = StepConfig.from_trainer(config, autocast_dtype(device))
    pad_id = pad_token_id(model)
    if d is None:
        optimizer, scheduler = build_optimizer(model, config)
        return _Policy(model, optimizer, scheduler, device, step_cfg, pad_id)
    group = distributed.Group(d)  # rank 0: the followers build the same policy from what it announces
    model, optimizer, scheduler = group.setup(model, config, str(model_path), step_cfg, pad_id,
                                              found.state if found else None)
    return _Policy(model, optimizer, scheduler, device, step_cfg, pad_id, group)


def train(store: Store, run_id: str, config: TrainerConfig, *, model_path: str | Path, tasks: Sequence[Any],
          sampler: Sampler, engine: AdapterSync | None = None, home: Path | None = None, resume: bool = False,
          on_step: Callable[[dict[str, Any], list[Any]], None] | None = None) -> TrainResult:
    """Train run `run_id` for `config.steps` steps (counted from 0, including steps done before a resume).

    Each sampled token's logprob is taken at the temperature its call recorded (trainer/data.py), so
    a harness that sends its own temperature is trained under the distribution it sampled from."""
    home = home or forge_home()
    found = latest_checkpoint(home, run_id)
    if found is not None and not resume:
        raise TrainerError(f"run {run_id} already has checkpoints (step {found.step}); resume it with --resume")
    stream = TaskStream(tasks, config.seed)
    pi = _build(config, model_path, found)
    start, position, adapter, kept = 0, 0, None, KeptGroups()
    pending: list[int] = []  # async: positions the checkpoint's buffer had admitted and not trained
    if found is not None:
        try:
            start, position, adapter = _restore(store, run_id, found, pi, stream, engine, config)
            pending = [int(p) for p in found.state.get("pending", ())]
            kept = _kept(store, run_id, stream, config, pending, position, start)
        except BaseException:
            pi.close()
            raise
    elif config.init_from:  # the policy starts from an adapter (an SFT result): step 0 samples with it too
        adapter = _serve_init(store, run_id, Path(config.init_from), engine)
    store.update_run(run_id, owner_pid=os.getpid(), policy_version=start)  # what new rollouts record
    store.set_run_status(run_id, "running")
    result = TrainResult(run_id=run_id, adapter=adapter)
    vision = TrajectoryImages.for_run(home, run_id, model_path)  # loads its processor on the first image only
    buffer = _buffer(config, sampler, run_id, stream, position, start, adapter, engine, store, pending, kept)
    try:
        for step in range(start, config.steps):
            # 1. sample: this step's groups, with the adapter the engine serves now (async: the next
            #    finished groups, each sampled by an adapter at most max_staleness versions old)
            t0 = time.perf_counter()
            extra: dict[str, Any] = {}
            if buffer is not None:
                taken = buffer.take(step)
                rollouts, step_tasks, extra = taken.rollouts, taken.tasks, taken.stats
            else:
                step_tasks = stream.take(position, config.tasks_per_step)
                rollouts = _sample_step(sampler, run_id, step_tasks, position, step, adapter, kept)
            if step == start and found is not None:
                extra = extra | kept.metrics()
            # 2. train: group advantages, micro-batches, one GRPO update
            t1 = time.perf_counter()
            ids = [r.id for r in rollouts]
            trajectories = store.list_trajectories(rollout_ids=ids)
            batch = build_batch(rollouts, trajectories, sampling=call_sampling(store, ids),
                                std_normalize=config.std_normalize, vision=vision,
                                max_versions=config.rollout_versions if buffer is not None else None)
            # versions per token (partial rollouts span several); a full fine-tune has no adapter names to count by
            if buffer is not None and not config.full_finetune:
                extra = extra | version_metrics(batch, step)
            metrics = pi.update(batch.samples, config, trajectories, vision)
            t2 = time.perf_counter()
            position = buffer.position if buffer is not None else position + len(step_tasks)
            metrics.update(_reward_metrics(batch, step_tasks), **_harness_rewards(rollouts), **extra, step=step,
                           n_rollouts=len(rollouts), t_rollout_s=t1 - t0, t_train_s=t2 - t1,
                           tokens_per_s=metrics["n_tokens"] / max(t2 - t1, 1e-9))
            # 3. save (the step is done once its checkpoint exists), 4. hot-load, 5. record
            model, optimizer = pi.saveable()
            path = save_checkpoint(home, run_id, step, model=model, optimizer=optimizer, scheduler=pi.scheduler,
                                   state={"position": position, "metrics": metrics, "fingerprint": stream.fingerprint,
                                          "pending": buffer.pending() if buffer is not None else []})
            adapter = result.adapter = _publish(store, run_id, step, path, engine, config)
            if buffer is not None:
                buffer.publish(step + 1, adapter)  # groups starting from now sample with it
            metrics["t_sync_s"] = time.perf_counter() - t2
            _record_step(store, run_id, metrics, adapter)
            result.steps.append(metrics)
            if on_step is not None:
                on_step(metrics, rollouts)  # the step's metrics and the rollouts it trained
    except BaseException as exc:
        status = "stopped" if isinstance(exc, KeyboardInterrupt) else "failed"
        store.set_run_status(run_id, status, error=None if status == "stopped" else f"{type(exc).__name__}: {exc}")
        store.interrupt_unfinished(run_id)
        raise
    finally:
        if buffer is not None:
            buffer.close()
        pi.close()
    store.set_run_status(run_id, "finished")
    return result


def _sample_step(sampler: Sampler, run_id: str, tasks: Sequence[Any], position: int, step: int,
                 adapter: str | None, kept: KeptGroups) -> list[Any]:
    """A synchronous step's rollouts, in stream order: the groups a resume kept, the others sampled now."""
    groups = [kept.take(p) for p in range(position, position + len(tasks))]
    missing = [t for t, g in zip(tasks, groups) if g is None]
    fresh = sampler.sample(run_id, missing, step=step, adapter=adapter) if missing else []
    if len(missing) == len(tasks):
        return fresh
    first: dict[str, int] = {}  # a task's first place in the step: fresh rows join the kept ones in the order a whole step has
    for i, t in enumerate(tasks):
        first.setdefault(str(_task_field(t, "id")), i)
    rows = [r for g in groups if g is not None for r in g.rollouts] + list(fresh)
    return sorted(rows, key=lambda r: first[r.task_id])


def _kept(store: Store, run_id: str, stream: TaskStream, config: TrainerConfig, pending: list[int], position: int,
          start: int) -> KeptGroups:
    """The finished groups a resume trains instead of sampling again (trainer/resume.py): of the pending
    positions and those up to K + 1 steps past the trained ones (all that can have been admitted)."""
    B = config.tasks_per_step
    ahead = range(position, min(config.steps * B, (start + config.max_staleness + 1) * B))
    return kept_groups(store, run_id, stream, pending + list(ahead), groups_per_step=B, start=start,
                       max_staleness=config.max_staleness,
                       by_adapter=not config.full_finetune and config.rollout_versions == 1)


def _buffer(config: TrainerConfig, sampler: Sampler, run_id: str, stream: TaskStream, position: int, start: int,
            adapter: str | None, engine: AdapterSync | None, store: Store, pending: Sequence[int] = (),
            kept: KeptGroups | None = None) -> GroupBuffer | None:
    """The asynchronous sampler when `max_staleness` > 0: groups of up to K + 1 versions run at once, so
    the engine keeps that many adapters (and the newest) loaded. A resume re-admits `pending` first,
    the groups in `kept` as they finished."""
    if config.max_staleness == 0:
        return None
    if engine is not None:
        engine.retain(config.max_staleness + 2)
    return GroupBuffer(sampler, run_id, stream, groups_per_step=config.tasks_per_step,
                       max_staleness=config.max_staleness, position=position, version=start, adapter=adapter,
                       end=config.steps * config.tasks_per_step, pending=pending, kept=kept,
                       partial=PartialRollouts(store, config.rollout_versions,
                                               config.rollout_versions_policy == "drop_group")
                       if config.rollout_versions > 1 else None)


def _restore(store: Store, run_id: str, found: Any, pi: _Policy, stream: TaskStream,
             engine: AdapterSync | None, config: TrainerConfig) -> tuple[int, int, str | None]:
    state = found.state
    if state.get("fingerprint") != stream.fingerprint:
        raise TrainerError(f"run {run_id} was trained on a different task set; resume it with the same tasks")
    if pi.group is None:  # under torchrun, Group.setup has loaded them on every rank
        pi.optimizer.load_state_dict(state["optimizer"])
        if state.get("scheduler") is not None:
            pi.scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    store.interrupt_unfinished(run_id)  # their groups are sampled again; finished ones may be kept (resume.py)
    # The engine may have restarted since: load the newest adapter again before the next rollouts.
    adapter = _publish(store, run_id, found.step, found.adapter_path, engine, config)
    if found.step not in {s.step for s in store.list_train_steps(run_id)}:
        _record_step(store, run_id, dict(state["metrics"]), adapter)  # killed between checkpoint and row
    return found.step + 1, int(state["position"]), adapter


def _serve_init(store: Store, run_id: str, path: Path, engine: AdapterSync | None) -> str:
    """Load trainer.init_from's adapter into the engine under the run's init name and serve it."""
    name = init_adapter_name(run_id)
    if engine is not None:
        engine.load(name, str(path))
    store.update_run(run_id, current_adapter=name, policy_version=0)
    return name


def _publish(store: Store, run_id: str, step: int, path: Path, engine: AdapterSync | None,
             config: TrainerConfig) -> str:
    """Make the engine serve step `step`'s weights and point the run's next rollouts at them."""
    name = adapter_name(run_id, step)
    if engine is not None:
        if config.full_finetune:
            engine.update_weights(str(path))
        else:
            engine.load(name, str(path))
    # Full fine-tuning replaces the base weights in place: rollouts then ask for no adapter, and the
    # version (set with the adapter, once the engine serves it) is what tells their weights apart.
    served = None if config.full_finetune else name
    store.update_run(run_id, current_adapter=served, policy_version=step + 1)
    if not any(c.step == step for c in store.list_checkpoints(run_id)):
        store.add_checkpoint(Checkpoint(run_id=run_id, step=step, kind="full" if config.full_finetune else "adapter",
                                        path=str(path), adapter_name=served, loaded=engine is not None))
    return served  # type: ignore[return-value]


def _reward_metrics(batch: Any, tasks: Sequence[Any]) -> dict[str, Any]:
    thresholds = {_task_field(t, "id"): _pass_threshold(t) for t in tasks}
    rewards = batch.rewards
    passed = [r >= thresholds.get(t, 1.0) for r, t in zip(rewards, batch.task_ids)]
    return {
        "reward_mean": statistics.fmean(rewards) if rewards else None,
        "reward_std": statistics.pstdev(rewards) if rewards else None,
        "pass_rate": sum(passed) / len(passed) if passed else None,
        "n_groups": batch.n_groups, "dropped_groups": batch.dropped_groups,
        "infra_failures": batch.infra_failures, "policy_failures": batch.policy_failures,
    }


def _harness_rewards(rollouts: Sequence[Any]) -> dict[str, Any]:
    """`reward_by_harness`: each harness's mean reward over the step's rewarded rollouts, when the step
    ran in several (harness.names); nothing otherwise."""
    per: dict[str, list[float]] = {}
    for r in rollouts:
        if r.reward is not None:
            per.setdefault(r.harness or "?", []).append(r.reward)
    return {"reward_by_harness": {h: statistics.fmean(v) for h, v in per.items()}} if len(per) > 1 else {}


def _task_field(task: Any, key: str, default: Any = None) -> Any:
    return task.get(key, default) if isinstance(task, dict) else getattr(task, key, default)


def _pass_threshold(task: Any) -> float:
    value = _task_field(task, "pass_threshold")
    return 1.0 if value is None else float(value)  # a task without one passes at full reward


_COLUMNS = ("loss", "reward_mean", "reward_std", "pass_rate", "kl", "clip_frac", "mismatch_mean", "mismatch_max",
            "grad_norm", "tokens_per_s", "t_rollout_s", "t_train_s", "t_sync_s")


def _record_step(store: Store, run_id: str, metrics: dict[str, Any], adapter: str | None) -> None:
    extra = {k: v for k, v in metrics.items() if k not in _COLUMNS and k not in ("step", "n_tokens", "n_rollouts")}
    store.add_train_step(TrainStep(
        run_id=run_id, step=int(metrics["step"]), n_tokens=int(metrics.get("n_tokens") or 0),
        n_rollouts=int(metrics.get("n_rollouts") or 0), adapter=adapter,
        metrics_json=extra, **{k: metrics.get(k) for k in _COLUMNS},
    ))
