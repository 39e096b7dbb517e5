"""Data-parallel GRPO under torchrun with PyTorch FSDP2 (`fully_shard`): gloo on CPU, NCCL on GPUs.

    torchrun --nproc_per_node N script.py      # every rank: init(), shard(model), then distributed_step(...)

Every rank holds the whole step's samples (rank 0 reads the store and broadcasts them: `broadcast`),
packs the same micro-batches, with loss weights computed over the whole step, and takes its share
of them, split by padded tokens (longest first onto the least-loaded rank). So rank r's loss is its
part of the one global sum; FSDP's reduce-scatter averages over the N ranks, so each rank scales its
loss weights by N (exact in floating point for a power of 2; gloo has no pre-multiplied sum for
`set_gradient_divide_factor(1)`): the update equals the one-process update on the same batch.

FSDP runs collectives inside every forward and backward (all-gather, reduce-scatter), so every rank
must run the same number of micro-batches in the same order: a rank with fewer gets copies of its
smallest one with zero loss weights (no gradient, no metric). For the same reason shared-prefix
units (trainer/prefix.py: a prefix forward, then suffix forwards and backwards, then a prefix
backward) are not used under FSDP: their collective order differs from a plain micro-batch's.

Rank 0 owns the store, the checkpoints and adapter publishing; the others only train.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist

from trainer.grpo import StepConfig, grpo_step


@dataclass(frozen=True)
class Dist:
    rank: int
    world: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init() -> Dist:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT)."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        device, backend = torch.device("cuda", local), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend)
    return Dist(dist.get_rank(), dist.get_world_size(), device)


def shard(model: Any) -> Any:
    """FSDP2 over every decoder layer and the root (a PEFT model: the LoRA weights shard with their layer)."""
    from torch.distributed.fsdp import fully_shard

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for layer in base.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def broadcast(obj: Any, d: Dist) -> Any:
    """Rank 0's `obj` on every rank (the step's samples: rank 0 alone reads the store)."""
    box = [obj if d.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def split_by_tokens(micro_batches: Sequence[dict[str, torch.Tensor]], world: int) -> list[list[int]]:
    """Micro-batch indices per rank: longest first onto the rank with the fewest padded tokens.

    >>> mbs = [{"input_ids": torch.zeros(1, n)} for n in (10, 4, 4, 2)]
    >>> split_by_tokens(mbs, 2)
    [[0], [1, 2, 3]]
    """
    load = [0] * world
    out: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(range(len(micro_batches)), key=lambda i: -micro_batches[i]["input_ids"].numel()):
        r = min(range(world), key=lambda r: (load[r], r))
        out[r].append(i)
        load[r] += int(micro_batches[i]["input_ids"].numel())
    return [sorted(x) for x in out]


def _idle(mb: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy of `mb` that contributes nothing: zero loss weights and an empty loss mask."""
    return {**mb, "weights": torch.zeros_like(mb["weights"]), "mask": torch.zeros_like(mb["mask"])}


def distributed_step(model: Any, optimizer: torch.optim.Optimizer, micro_batches: list[dict[str, torch.Tensor]],
                     cfg: StepConfig, d: Dist, scheduler: Any = None) -> dict[str, float]:
    """This rank's share of one GRPO update; returns the step's metrics over all ranks (on every rank)."""
    if any("prefix_id" in mb for mb in micro_batches):
        raise ValueError("shared-prefix micro-batches cannot run under FSDP; pack with share_prefix_min=0")
    shares = split_by_tokens(micro_batches, d.world)
    mine = [{**micro_batches[i], "weights": micro_batches[i]["weights"] * d.world} for i in shares[d.rank]]
    most = max(len(s) for s in shares)
    smallest = min(micro_batches, key=lambda mb: mb["input_ids"].numel())
    mine += [_idle(smallest)] * (most - len(mine))
    m = grpo_step(model, optimizer, mine, cfg, scheduler)
    tok = float(m["n_tokens"])
    sums = torch.tensor([m["loss"] / d.world, m["clip_frac"] * tok, m["kl"] * tok, m["tis_frac"] * tok,
                         m["mismatch_mean"] * tok, tok], dtype=torch.float64)
    dist.all_reduce(sums)
    peak = torch.tensor([m["mismatch_max"]], dtype=torch.float64)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    n = max(float(sums[5]), 1.0)
    return {"loss": float(sums[0]), "clip_frac": float(sums[1]) / n, "kl": float(sums[2]) / n,
            "tis_frac": float(sums[3]) / n, "mismatch_mean": float(sums[4]) / n, "mismatch_max": float(peak[0]),
            "grad_norm": m["grad_norm"], "n_tokens": int(sums[5])}
