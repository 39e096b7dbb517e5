"""`forge sft --nproc N`: the SFT step on N ranks under torchrun, sharded with FSDP2 (trainer/distributed.py).

    forge sft --nproc 2 --from RUN     # torchrun --nproc_per_node 2 -m openforge.forge_cli.main sft ...
      rank 0: the run (store, examples), then trainer/sft.py's loop with `Ranks`
      rank 1: trainer/sft.py's follow(): receives the job from rank 0 (`announce`), runs the same loop,
              never touches the store

The step is the one-process step, split: one packed row is one optimizer step; its sequences are
dealt to the ranks by tokens (longest first onto the least-loaded rank), each rank packs its share into
a row of its own and weighs its summed NLL by N / (the whole row's supervised tokens). FSDP's
reduce-scatter averages the N gradients, so the update is the gradient of

    sum over ranks of NLL_r / T  =  the one-process row's token-mean loss

(attention never crosses sequences in a packed row, so splitting the row changes no log-probability).
A rank with no sequence in a step runs the smallest one with weight 0: FSDP's collectives need every
rank to run the same forwards and backwards. Validation is split the same way; checkpoints are
gathered onto rank 0 in the one-process format (trainer/distributed.Gathered).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from openforge.trainer.distributed import Dist, broadcast, init, leave


@dataclass
class Resumption:
    """Where a resumed `forge sft` run stands: its last checkpoint's step (an epoch's end), the state
    that step left, and rank 0's adapter to load (the other ranks get its weights by broadcast)."""

    step: int
    adapter_path: str
    scheduler: dict[str, Any]
    train_losses: list[float]
    val_losses: list[float]
    optimizer: dict[str, Any] | None = None  # rank 0 only: the others get it by broadcast (shard_and_sync)


@dataclass
class SftJob:
    """What rank 0 announces once: enough for every rank to run the same loop on the same rows."""

    model_path: str
    config: dict[str, Any]  # TrainerConfig.model_dump()
    train: list[Any]  # Example
    val: list[Any]
    epochs: int
    max_tokens: int
    resumed: Resumption | None = None


def share(lengths: Sequence[int], world: int) -> list[list[int]]:
    """Sequence indices per rank: longest first onto the rank with the fewest tokens (ties: lower rank).

    >>> share([5, 9, 2, 4], 2)
    [[1, 2], [0, 3]]
    >>> share([7], 2)
    [[0], []]
    """
    load = [0] * world
    out: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        out[r].append(i)
        load[r] += lengths[i]
    return [sorted(x) for x in out]


class Ranks:
    """This rank's part of each packed row, and the sums over all ranks."""

    def __init__(self, d: Dist) -> None:
        self.d = d

    def part(self, rows: Sequence[Any]) -> tuple[list[Any], float]:
        """(this rank's sequences of the row, the weight of its summed NLL before the token mean):
        N for a share, 0 for the idle copy of the row's smallest sequence."""
        mine = share([len(e.token_ids) for e in rows], self.d.world)[self.d.rank]
        if not mine:
            smallest = min(range(len(rows)), key=lambda i: (len(rows[i].token_ids), i))
            return [rows[smallest]], 0.0
        return [rows[i] for i in mine], float(self.d.world)

    def total(self, value: torch.Tensor) -> float:
        """The sum of a detached scalar over all ranks (float64: the loss a person reads)."""
        box = value.detach().to(torch.float64).cpu().reshape(1)
        dist.all_reduce(box)
        return float(box[0])


def announce(d: Dist, job: SftJob | None) -> None:
    """Rank 0: the job to the other ranks (None: nothing to train, they exit). The optimizer state
    stays on rank 0: shard_and_sync sends each rank its shard."""
    if job is not None and job.resumed is not None:
        job = replace(job, resumed=replace(job.resumed, optimizer=None))
    broadcast(job, d)
