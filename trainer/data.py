"""From the store's rows to tensors: Trajectory + Rollout -> samples with advantages -> micro-batches.

A rollout may have several trajectory segments (the harness rewrote its history, so the proxy
started a new token sequence); every segment is a training row with the rollout's advantage.

Group rule (SkyRL's): if any rollout of a group failed for infrastructure reasons (no reward: the
sandbox died, the run was interrupted, ...), the whole group is dropped, because the remaining rewards
would be normalised against a biased group. A rollout that ran out of time but was scored is data.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Sequence

import torch

from openforge.errors import TrainerError
from openforge.store import Rollout, Trajectory
from trainer.grpo import aggregation_weights, group_advantages


@dataclass
class Sample:
    """One trajectory segment, ready for the loss."""

    rollout_id: str
    task_id: str
    segment: int
    token_ids: list[int]
    loss_mask: list[int]  # 1 on tokens the engine sampled
    logprobs: list[float]  # the engine's sampling logprob (0.0 where the mask is 0)
    advantage: float
    reward: float


@dataclass
class Batch:
    samples: list[Sample]
    rewards: list[float]  # one per usable rollout (groups kept)
    task_ids: list[str] = field(default_factory=list)  # aligned with `rewards`
    n_groups: int = 0
    dropped_groups: int = 0
    dropped_rollouts: list[str] = field(default_factory=list)


def is_usable(rollout: Rollout) -> bool:
    """A rollout is data when it ended with a reward: scored, or timed out and scored as such."""
    return rollout.reward is not None and rollout.status in ("scored", "timed_out")


def _parse(traj: Trajectory) -> tuple[list[int], list[int], list[float]]:
    ids = json.loads(traj.token_ids or "[]")
    mask = json.loads(traj.loss_mask or "[]")
    logp = json.loads(traj.logprobs or "[]")
    if not (len(ids) == len(mask) == len(logp)):
        raise TrainerError(
            f"trajectory {traj.rollout_id}/{traj.segment} is inconsistent: {len(ids)} tokens, "
            f"{len(mask)} mask values, {len(logp)} logprobs"
        )
    if mask and mask[0]:
        raise TrainerError(f"trajectory {traj.rollout_id}/{traj.segment} starts with a sampled token (no prompt)")
    return ids, mask, logp


def build_batch(rollouts: Sequence[Rollout], trajectories: Sequence[Trajectory], *,
                std_normalize: bool = True, eps: float = 1e-6) -> Batch:
    """Group rollouts by task, drop groups with an infrastructure failure, attach advantages."""
    groups: dict[tuple[str, int], list[Rollout]] = defaultdict(list)
    for r in rollouts:
        groups[(r.task_id, r.step)].append(r)
    by_rollout: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        by_rollout[t.rollout_id].append(t)

    batch = Batch(samples=[], rewards=[])
    for members in groups.values():
        if not all(is_usable(r) for r in members):
            batch.dropped_groups += 1
            batch.dropped_rollouts += [r.id for r in members]
            continue
        batch.n_groups += 1
        rewards = torch.tensor([float(r.reward) for r in members])  # type: ignore[arg-type]
        adv = group_advantages(rewards, std_normalize=std_normalize, eps=eps)
        for r, a in zip(members, adv.tolist()):
            batch.rewards.append(float(r.reward))  # type: ignore[arg-type]
            batch.task_ids.append(r.task_id)
            for t in sorted(by_rollout.get(r.id, []), key=lambda t: t.segment):
                ids, mask, logp = _parse(t)
                if sum(mask) == 0:
                    continue
                batch.samples.append(Sample(r.id, r.task_id, t.segment, ids, mask, logp, a, float(r.reward)))  # type: ignore[arg-type]
    return batch


def micro_batches(samples: Sequence[Sample], *, token_budget: int, pad_id: int, loss_agg: str,
                  device: torch.device | str = "cpu") -> list[dict[str, torch.Tensor]]:
    """Pack samples into right-padded micro-batches of at most `token_budget` padded tokens each.

    A sample longer than the budget gets a micro-batch of its own. Loss weights are computed over
    the whole step (all micro-batches), so gradient accumulation gives exactly the full-batch loss.
    Tensors: input_ids/attention_mask [B, T]; mask/old_logp/weights [B, T-1] (aligned with the
    predicted tokens 1..T-1); advantages [B]; first (scalar): the earliest sampled token position.
    """
    if not samples:
        return []
    seq_of = {rid: i for i, rid in enumerate(dict.fromkeys(s.rollout_id for s in samples))}
    max_len = max(len(s.token_ids) for s in samples)
    full_mask = torch.zeros(len(samples), max_len - 1)
    for i, s in enumerate(samples):
        full_mask[i, : len(s.token_ids) - 1] = torch.tensor(s.loss_mask[1:], dtype=torch.float32)
    seq_ids = torch.tensor([seq_of[s.rollout_id] for s in samples])
    full_weights = aggregation_weights(full_mask, loss_agg, seq_ids)

    # Longest first, so each micro-batch holds rows of similar length (little padding).
    order = sorted(range(len(samples)), key=lambda i: -len(samples[i].token_ids))
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * len(samples[groups[-1][0]].token_ids) <= token_budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return [_collate([samples[i] for i in g], full_weights[g], pad_id, device) for g in groups]


def _collate(rows: list[Sample], weights: torch.Tensor, pad_id: int, device: torch.device | str
             ) -> dict[str, torch.Tensor]:
    T = max(len(s.token_ids) for s in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    attn = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T - 1)
    old = torch.zeros(len(rows), T - 1)
    for i, s in enumerate(rows):
        n = len(s.token_ids)
        ids[i, :n] = torch.tensor(s.token_ids)
        attn[i, :n] = 1
        mask[i, : n - 1] = torch.tensor(s.loss_mask[1:], dtype=torch.float32)
        old[i, : n - 1] = torch.tensor(s.logprobs[1:], dtype=torch.float32)
    return {
        "input_ids": ids.to(device), "attention_mask": attn.to(device), "mask": mask.to(device),
        "old_logp": old.to(device), "weights": weights[:, : T - 1].contiguous().to(device),
        "advantages": torch.tensor([s.advantage for s in rows]).to(device),
        # the first sampled token of any row: logits before it are never needed
        "first": torch.tensor(min(s.loss_mask.index(1) for s in rows)),
    }
