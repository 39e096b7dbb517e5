"""Supervised fine-tuning on recorded trajectories (`forge sft`): the step before RL.

The data are rollouts already recorded - a teacher behind the proxy (`engine.kind = "remote"`, its
calls re-tokenised for the student) or any earlier run - kept when their reward reaches
`min_reward` (rejection sampling). Each rollout's trajectory rows (rollouts/runner/trajectory.py, the
same rows RL trains on) give the tokens and the loss mask: the loss is on the assistant's tokens only.

    loss = - sum_t mask_t * log pi(x_t | x_<t) / sum_t mask_t          (token mean over a packed row)

Tasks are split, not rollouts: `val_tasks` of the kept tasks are held out, and their loss is the
validation loss after every epoch. Sequences are packed (trainer/packing.py) into rows of at most
`sft.max_tokens` tokens, attention kept within each; one row is one optimizer step and a train_step
row of the run (kind `sft`), and the adapter is saved at the end (trainer/checkpoint.py:
`runs/<run>/adapters/step-N`, the folder `forge up --init-from` loads).
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from openforge.config import TrainerConfig
from openforge.errors import TrainerError
from openforge.rollouts.runner.trajectory import assemble_rollout
from openforge.store import Store, TrainStep
from openforge.trainer.checkpoint import Resumed, save_checkpoint
from openforge.trainer.distributed import broadcast, gather, init, launched, leave, shard_and_sync
from openforge.trainer.model import build_optimizer, build_policy, pick_device
from openforge.trainer.packing import pack, packed_nll, packed_row
from openforge.trainer.sft_ranks import Ranks, Resumption, SftJob, announce


@dataclass
class Example:
    """One training sequence: a trajectory segment of a kept rollout."""

    rollout_id: str
    task_id: str
    token_ids: list[int]
    loss_mask: list[int]


@dataclass
class SftResult:
    steps: int
    adapter_path: Path
    train_losses: list[float] = field(default_factory=list)  # one per step
    val_losses: list[float] = field(default_factory=list)  # one per epoch (empty without held-out tasks)
    n_train: int = 0
    n_val: int = 0


def select_examples(store: Store, run_ids: Sequence[str], *, min_reward: float) -> list[Example]:
    """The segments of every rollout of `run_ids` scored at least `min_reward`, assembled from their
    calls if they were not yet (re-tokenised teacher calls assemble like sampled ones)."""
    out: list[Example] = []
    for run_id in run_ids:
        store.get_run(run_id)  # NotFoundError with the id
        kept = [r for r in store.list_rollouts(run_id) if r.reward is not None and r.reward >= min_reward]
        if not kept:
            continue
        rows = store.list_trajectories(rollout_ids=[r.id for r in kept])
        missing = {r.id for r in kept} - {t.rollout_id for t in rows}
        for rollout_id in missing:
            assemble_rollout(store, rollout_id)
        if missing:
            rows = store.list_trajectories(rollout_ids=[r.id for r in kept])
        task = {r.id: r.task_id for r in kept}
        for t in sorted(rows, key=lambda t: (t.rollout_id, t.segment)):
            if t.token_ids and t.loss_mask and any(t.loss_mask):
                out.append(Example(t.rollout_id, task[t.rollout_id], list(t.token_ids), list(t.loss_mask)))
    return out


def split_by_task(examples: Sequence[Example], val_tasks: int, seed: int) -> tuple[list[Example], list[Example]]:
    """(train, validation): `val_tasks` whole tasks held out (none if fewer than two tasks)."""
    tasks = sorted({e.task_id for e in examples})
    if val_tasks <= 0 or len(tasks) < 2:
        return list(examples), []
    held = set(random.Random(seed).sample(tasks, min(val_tasks, len(tasks) - 1)))
    return [e for e in examples if e.task_id not in held], [e for e in examples if e.task_id in held]


def packed_rows(examples: Sequence[Example], max_tokens: int) -> list[list[Example]]:
    """`examples` packed into rows of at most `max_tokens` tokens (trainer/packing.py), in order."""
    return [[examples[i] for i in row] for row in pack(examples, max_tokens)]


def row_loss(model: Any, rows: Sequence[Example], *, device: torch.device) -> tuple[torch.Tensor, int]:
    """(summed NLL, supervised tokens) of `rows` packed into one row, attention kept within each."""
    row = packed_row(rows)
    return packed_nll(model, row, device), row.n_targets


def _step_loss(model: Any, rows: Sequence[Example], ranks: Ranks | None, *,
               device: torch.device) -> tuple[torch.Tensor, float]:
    """(the loss to backpropagate, the row's token-mean loss): on N ranks, this rank's share of the
    row weighed so that FSDP's average of the N gradients is the one-process gradient
    (trainer/sft_ranks.py), the value summed over the ranks."""
    if ranks is None:
        nll, n_targets = row_loss(model, rows, device=device)
        loss = nll / max(n_targets, 1)  # token mean over the row
        return loss, float(loss.detach())
    n_targets = packed_row(rows).n_targets
    mine, weight = ranks.part(rows)
    nll, _ = row_loss(model, mine, device=device)
    return nll * (weight / max(n_targets, 1)), ranks.total(nll * (weight > 0)) / max(n_targets, 1)


@torch.no_grad()
def evaluate_loss(model: Any, examples: Sequence[Example], *, max_tokens: int, device: torch.device,
                  ranks: Ranks | None = None) -> float:
    """The token-mean loss over `examples` (every masked token weighs the same)."""
    total = tokens = 0.0
    model.eval()
    for rows in packed_rows(examples, max_tokens):
        if ranks is None:
            nll, n = row_loss(model, rows, device=device)
            total += float(nll)
        else:
            mine, weight = ranks.part(rows)
            nll, _ = row_loss(model, mine, device=device)
            total += ranks.total(nll * (weight > 0))
            n = packed_row(rows).n_targets
        tokens += n
    model.train()
    return total / max(tokens, 1.0)


def train_sft(store: Store, home: Path, run_id: str, *, model_path: Path, examples: Sequence[Example],
              cfg: TrainerConfig, epochs: int, max_tokens: int, val_tasks: int = 0,
              on_step: Callable[[TrainStep], Any] | None = None, resumed: Resumed | None = None) -> SftResult:
    """SFT of the policy at `model_path` (LoRA, or full with `trainer.full_finetune`) on `examples`,
    packed into rows of `max_tokens` (one row, one optimizer step); every step recorded as a train_step
    row of `run_id`, a checkpoint saved after each epoch. `resumed` (the run's latest checkpoint)
    continues after its step: the same rows (the seed shuffles them), none trained twice. Under
    torchrun (`forge sft --nproc N`) this is rank 0: the other ranks run `follow()` and
    train with it, sharded with FSDP2."""
    train, val = split_by_task(examples, val_tasks, cfg.seed)
    job = SftJob(str(model_path), cfg.model_dump(), train, val, epochs, max_tokens,
                 resumption(resumed)) if train else None
    ranks = Ranks(init()) if launched() else None
    if ranks is not None:
        announce(ranks.d, job)
    if job is None:
        if ranks is not None:
            leave()
        raise TrainerError("no trajectories to train on: no rollout of the given runs reached the reward threshold")

    def record(step: int, value: float, grad_norm: float, rows: Sequence[Example], metrics: dict[str, Any],
               elapsed: float) -> None:
        n_tokens = sum(len(e.token_ids) for e in rows)
        row = store.add_train_step(TrainStep(
            run_id=run_id, step=step, loss=value, grad_norm=grad_norm, n_tokens=n_tokens,
            n_rollouts=len({e.rollout_id for e in rows}), t_train_s=elapsed,
            tokens_per_s=n_tokens / max(elapsed, 1e-9), metrics_json={**metrics, "sequences": len(rows)}))
        if on_step is not None:
            on_step(row)

    def save(model: Any, optimizer: Any, scheduler: Any, result: SftResult) -> Path:
        return save_checkpoint(home, run_id, result.steps, model=model, optimizer=optimizer, scheduler=scheduler,
                               state={"kind": "sft", "val_losses": result.val_losses,
                                      "train_losses": result.train_losses})

    result = fit(job, cfg, ranks, record=record, save=save)
    if ranks is not None:
        leave()
    return result


def follow() -> None:
    """A torchrun rank other than 0: run rank 0's job with it (`train_sft` announces it), then leave.
    Ctrl-C is rank 0's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    d = init()
    try:
        job: SftJob | None = broadcast(None, d)
        if job is not None:
            fit(job, TrainerConfig(**job.config), Ranks(d))
        leave()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def fit(job: SftJob, cfg: TrainerConfig, ranks: Ranks | None, *,
        record: Callable[[int, float, float, Sequence[Example], dict[str, Any], float], None] | None = None,
        save: Callable[[Any, Any, Any, SftResult], Path] | None = None) -> SftResult:
    """The SFT loop, the same on every rank (rank 0 alone has `record` and `save`): the policy, the
    epochs' packed rows (shuffled with `trainer.seed`: the same rows on every rank), one optimizer step
    a row, the validation loss and a checkpoint after each epoch (from `job.resumed`'s step on)."""
    torch.manual_seed(cfg.seed)
    device = ranks.d.device if ranks is not None else pick_device(cfg.device)
    back = job.resumed
    # rank 0 loads a resumed run's adapter; the other ranks get its weights from rank 0 (shard_and_sync)
    load = back is not None and (ranks is None or ranks.d.is_main)
    model = build_policy(job.model_path, cfg, device=device, resume_from=Path(back.adapter_path) if load else None)
    model.train()
    order = random.Random(cfg.seed)
    epoch_rows = []  # every epoch's rows up front: the LR schedule needs the number of steps
    for _ in range(job.epochs):
        shuffled = list(job.train)
        order.shuffle(shuffled)
        epoch_rows.append(packed_rows(shuffled, job.max_tokens))
    schedule = cfg.model_copy(update={"steps": sum(len(rows) for rows in epoch_rows), "epochs_per_step": 1})
    if ranks is None:
        optimizer, scheduler = build_optimizer(model, schedule)
        if back is not None:
            optimizer.load_state_dict(back.optimizer)
    else:
        model, optimizer, scheduler = shard_and_sync(model, schedule, ranks.d, back is not None,
                                                     back.optimizer if back else None)
    if back is not None:
        scheduler.load_state_dict(back.scheduler)
    result = SftResult(steps=0, adapter_path=Path(back.adapter_path) if back else Path(), n_train=len(job.train),
                       n_val=len(job.val),
                       train_losses=list(back.train_losses) if back else [],
                       val_losses=list(back.val_losses) if back else [])
    for epoch, packed in enumerate(epoch_rows):
        if back is not None and result.steps + len(packed) <= back.step:  # trained before the checkpoint
            result.steps += len(packed)
            continue
        for rows in packed:
            started = time.perf_counter()
            loss, value = _step_loss(model, rows, ranks, device=device)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad],
                                                       cfg.max_grad_norm)
            optimizer.step()
            scheduler.step()
            result.steps += 1
            result.train_losses.append(value)
            if record is not None:
                record(result.steps, value, float(grad_norm), rows,
                       {"epoch": epoch, "lr": scheduler.get_last_lr()[0]}, time.perf_counter() - started)
        if job.val:
            result.val_losses.append(evaluate_loss(model, job.val, max_tokens=job.max_tokens, device=device,
                                                   ranks=ranks))
        # every rank gathers (a collective); rank 0's copy is the whole, in the one-process format
        whole = gather(model, optimizer, ranks.d) if ranks is not None else None
        if save is not None:
            result.adapter_path = save(whole or model, whole or optimizer, scheduler, result)
    return result


def resumption(resumed: Resumed | None) -> Resumption | None:
    """A run's latest checkpoint as the job's starting point (None: from the start)."""
    if resumed is None:
        return None
    state = resumed.state
    if state.get("kind") != "sft":
        raise TrainerError(f"checkpoint {resumed.adapter_path} is not an SFT run's")
    return Resumption(resumed.step, str(resumed.adapter_path), state["scheduler"], list(state.get("train_losses", [])),
                      list(state.get("val_losses", [])), optimizer=state["optimizer"])
