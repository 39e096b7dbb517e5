"""From the store's rows to tensors: Trajectory + Rollout -> samples with advantages -> micro-batches.

A rollout may have several trajectory segments (the harness rewrote its history, so the proxy
started a new token sequence); every segment is a training row with the rollout's advantage.

Each sampled token is scored at the temperature its call was sampled at (`Call.temperature`, found
through the trajectory's `call_ids`): harnesses send their own settings, and the engine's logprob is
of the temperature-scaled distribution (see `logprob_temperature`).

Versions per token. Each call records the adapter that served it (`Call.adapter`); with partial
rollouts (`trainer.rollout_versions` > 1) one rollout's calls may come from several adapter versions.
Each sampled token keeps its own call's logprob as its behaviour logprob (the loss's TIS weight
pi_old / mu is taken against it, token by token) and its own version (`Sample.versions`); a group
with a rollout spanning more versions than the cap is dropped and counted (`version_dropped_groups`).

Group rule (SkyRL's): if any rollout of a group failed for infrastructure reasons (no reward: the
sandbox died, the engine failed its call, the harness broke, the run was interrupted, ...), the whole
group is dropped, because the remaining rewards would be normalised against a biased group. A rollout
the policy ended is data: a timeout, or the harness stopping on the policy's own failure (its turn
limit, a context it filled: scored 0, failure_kind "policy"). Both counts go into the step's metrics.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import torch

from openforge.engine.sampling import return_original_logprob
from openforge.errors import TrainerError
from openforge.trainer.checkpoint import adapter_version
from openforge.trainer.grpo import aggregation_weights, group_advantages
from openforge.trainer.prefix import shared_prefixes

if TYPE_CHECKING:  # annotations only: batching and the loss run without the store's SQL stack (a GPU box)
    from openforge.store import Rollout, Store, Trajectory


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
    temperatures: list[float] | None = None  # per token: the temperature its logprob is taken at; None = 1.0
    versions: list[int] | None = None  # per token: the adapter version that sampled it (-1 on prompt tokens)
    # a vision-language row: its images' pixel values [patches, D] and grids [n, 3], re-created from
    # the run's stored images (trainer/vision.py); None for text
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None


@dataclass(frozen=True)
class CallSampling:
    """What the trainer needs of one recorded call: its sampling settings and completion length."""

    temperature: float | None  # None: the harness sent none and the engine used its default (1.0)
    top_k: int | None
    n_completion: int
    version: int | None = 0  # the version of the adapter that served it (`adapter_version`; None: not the run's)


def logprob_temperature(temperature: float | None, top_k: int | None) -> float:
    """The temperature whose softmax the engine's recorded logprob is taken under.

    The same rule as engine/sampling.py and SGLang's sampler (`logprobs = log(softmax(logits / T))`,
    taken *before* top-k / top-p / min-p truncation, so top_p and a top_k > 1 do not change it):

    >>> [logprob_temperature(t, k) for t, k in ((0.7, None), (None, None), (0.0, None), (0.7, 1), (0.7, 40))]
    [0.7, 1.0, 1.0, 1.0, 0.7]

    No temperature is SGLang's default 1.0; greedy (temperature < 1e-6 or top_k == 1) reports the raw
    log_softmax; SGLANG_RETURN_ORIGINAL_LOGPROB=1 (read by the engine and here) reports it always."""
    if temperature is None or temperature < 1e-6 or top_k == 1 or return_original_logprob():
        return 1.0
    return float(temperature)


def call_sampling(store: Store, rollout_ids: Sequence[str]) -> dict[int, CallSampling]:
    """The sampling settings of every recorded call of these rollouts, by call id."""
    out: dict[int, CallSampling] = {}
    for rid in rollout_ids:
        for c in store.list_calls(rollout_id=rid):
            if c.id is not None:
                out[c.id] = CallSampling(c.temperature, c.top_k,
                                         len(c.completion_ids or []), adapter_version(c.run_id, c.adapter))
    return out


def _per_token(traj: Trajectory, mask: list[int], sampling: Mapping[int, CallSampling] | None
               ) -> tuple[list[float] | None, list[int] | None]:
    """Per token of a segment, the temperature (1.0 on prompt tokens) and the adapter version (-1 on
    prompt tokens) of the call that sampled it; temperatures None when all are 1.0.

    A segment's mask-1 tokens are its calls' completions, in `call_ids` order (rollouts/runner/trajectory.py
    builds it so); a count that does not add up is an error, never a silent default."""
    call_ids = traj.call_ids or []
    if sampling is None or not call_ids:  # rows written without calls (tests, direct sampling)
        return None, None
    temps: list[float] = []
    versions: list[int | None] = []
    for cid in call_ids:
        cs = sampling.get(cid)
        if cs is None:
            raise TrainerError(f"trajectory {traj.rollout_id}/{traj.segment} lists call {cid}, which is not recorded")
        temps += [logprob_temperature(cs.temperature, cs.top_k)] * cs.n_completion
        versions += [cs.version] * cs.n_completion
    if len(temps) != sum(mask):
        raise TrainerError(f"trajectory {traj.rollout_id}/{traj.segment} has {sum(mask)} sampled tokens but its "
                           f"calls completed {len(temps)}")
    it_v = iter(versions)
    per_version = None if None in versions else [next(it_v) if m else -1 for m in mask]  # type: ignore[misc]
    if all(t == 1.0 for t in temps):
        return None, per_version
    it = iter(temps)
    return [next(it) if m else 1.0 for m in mask], per_version


def _rollout_versions(trajs: Sequence[Trajectory], sampling: Mapping[int, CallSampling] | None) -> set[int]:
    """The adapter versions that served a rollout's trained calls."""
    if sampling is None:
        return set()
    return {v for t in trajs for c in (t.call_ids or []) if c in sampling and (v := sampling[c].version) is not None}


@dataclass
class Batch:
    samples: list[Sample]
    rewards: list[float]  # one per usable rollout (groups kept)
    task_ids: list[str] = field(default_factory=list)  # aligned with `rewards`
    n_groups: int = 0
    dropped_groups: int = 0
    dropped_rollouts: list[str] = field(default_factory=list)
    infra_failures: int = 0  # rollouts without a reward (infra, harness, interrupted): their groups dropped
    policy_failures: int = 0  # rollouts the harness ended on the policy's failure: scored 0, kept
    version_dropped_groups: int = 0  # groups with a rollout over the cap on versions per rollout: dropped
    spanning_rollouts: int = 0  # rollouts of kept groups whose calls were served by more than one version


def is_usable(rollout: Rollout) -> bool:
    """A rollout is data when it ended with a reward: scored, or timed out and scored as such."""
    return rollout.reward is not None and rollout.status in ("scored", "timed_out")


def _parse(traj: Trajectory) -> tuple[list[int], list[int], list[float]]:
    ids = traj.token_ids or []
    mask = traj.loss_mask or []
    logp = traj.logprobs or []
    if not (len(ids) == len(mask) == len(logp)):
        raise TrainerError(
            f"trajectory {traj.rollout_id}/{traj.segment} is inconsistent: {len(ids)} tokens, "
            f"{len(mask)} mask values, {len(logp)} logprobs"
        )
    if mask and mask[0]:
        raise TrainerError(f"trajectory {traj.rollout_id}/{traj.segment} starts with a sampled token (no prompt)")
    return ids, mask, logp


def build_batch(rollouts: Sequence[Rollout], trajectories: Sequence[Trajectory], *,
                sampling: Mapping[int, CallSampling] | None = None, std_normalize: bool = True,
                eps: float = 1e-6, vision: Any = None, max_versions: int | None = None) -> Batch:
    """Group rollouts by task, drop groups with an infrastructure failure, attach advantages (a policy
    failure is a member like any other, with its reward 0).

    `sampling` (from `call_sampling`) gives each sampled token its call's temperature; without it
    every token is taken at temperature 1. `vision` (trainer/vision.py TrajectoryImages) re-creates
    the pixel inputs of segments with images; a segment with images and no `vision` is an error.
    `max_versions` (trainer.rollout_versions): a group with a rollout whose calls span more adapter
    versions is dropped (`version_dropped_groups`)."""
    groups: dict[tuple[str, int], list[Rollout]] = defaultdict(list)
    for r in rollouts:
        groups[(r.task_id, r.step)].append(r)
    by_rollout: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        by_rollout[t.rollout_id].append(t)

    batch = Batch(samples=[], rewards=[], infra_failures=sum(1 for r in rollouts if not is_usable(r)),
                  policy_failures=sum(1 for r in rollouts if is_usable(r) and r.failure_kind == "policy"))
    for members in groups.values():
        if not all(is_usable(r) for r in members):
            batch.dropped_groups += 1
            batch.dropped_rollouts += [r.id for r in members]
            continue
        spans = [len(_rollout_versions(by_rollout.get(r.id, []), sampling)) for r in members]
        if max_versions is not None and max(spans, default=0) > max_versions:
            batch.version_dropped_groups += 1
            continue
        batch.spanning_rollouts += sum(1 for n in spans if n > 1)
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
                temps, versions = _per_token(t, mask, sampling)
                sample = Sample(r.id, r.task_id, t.segment, ids, mask, logp, a, float(r.reward), temps,  # type: ignore[arg-type]
                                versions)
                if getattr(t, "images", None):
                    if vision is None:
                        raise TrainerError(f"trajectory {t.rollout_id}/{t.segment} holds images but this trainer "
                                           "was given no image source")
                    sample.pixel_values, sample.image_grid_thw = vision.inputs(t, ids)
                batch.samples.append(sample)
    return batch


def version_metrics(batch: Batch, step: int) -> dict[str, Any]:
    """An asynchronous step's per-token view: sampled tokens by how many versions behind the trained
    policy their sampler was (`token_staleness`, step - version: the adapter trained at step s is
    version s), rollouts that spanned versions, groups dropped at the cap."""
    behind: dict[int, int] = defaultdict(int)
    for s in batch.samples:
        for v in s.versions or []:
            if v >= 0:
                behind[step - v] += 1
    return {"token_staleness": dict(sorted(behind.items())), "spanning_rollouts": batch.spanning_rollouts,
            "version_dropped_groups": batch.version_dropped_groups}


def micro_batches(samples: Sequence[Sample], *, token_budget: int, pad_id: int, loss_agg: str,
                  device: torch.device | str = "cpu", share_prefix_min: int = 0) -> list[dict[str, torch.Tensor]]:
    """Pack samples into right-padded micro-batches of at most `token_budget` padded tokens each.

    A sample longer than the budget gets a micro-batch of its own. Loss weights are computed over
    the whole step (all micro-batches), so gradient accumulation gives exactly the full-batch loss.
    Tensors: input_ids/attention_mask [B, T]; mask/old_logp/weights/temperature [B, T-1] (aligned
    with the predicted tokens 1..T-1); advantages [B]; first (scalar): the earliest sampled token.

    With `share_prefix_min` > 0, rows sharing a prompt prefix of at least that many tokens (a GRPO
    group's prompt; a harness's system prompt across groups) are packed together: their micro-batches
    hold only the suffixes after the prefix, plus `prefix_ids` [P] and `prefix_id` (the same for
    every micro-batch of that prefix, which are consecutive); trainer/prefix.py runs the prefix once.
    Rows of a unit that share more than its prefix also get `prefix2_ids` / `prefix2_id` (run once
    on top of the unit's prefix) and hold only what follows both.
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

    mm = [i for i, s in enumerate(samples) if s.image_grid_thw is not None]
    if mm and share_prefix_min > 0:
        # Rows with images are not prefix-shared: a VLM's M-RoPE positions after an image depend on the
        # image's grid (a text token's position is not its index), and a prefix cut inside an image
        # run would split one vision-encoder pass. They run whole, in units of their own; text rows
        # share prefixes as before.
        text = [i for i in range(len(samples)) if samples[i].image_grid_thw is None]
        units = [(P, [text[k] for k in ks]) for P, ks in shared_prefixes([samples[i] for i in text], share_prefix_min)]
        units.append((0, mm))
    else:
        units = shared_prefixes(samples, share_prefix_min) if share_prefix_min > 0 else [(0, list(range(len(samples))))]
    out: list[dict[str, torch.Tensor]] = []
    inner_units = 0
    for unit, (P, members) in enumerate(units):
        prefix = torch.tensor(samples[members[0]].token_ids[:P]).to(device) if P else None
        # Inside a unit, rows that go on sharing past its prefix (a group's own prompt) share that too.
        inner = shared_prefixes([_Tail(samples[i], P) for i in members], share_prefix_min) \
            if P and len(members) > 2 else [(0, list(range(len(members))))]
        for P2, ks in inner:
            rows = [members[k] for k in ks]
            prefix2 = torch.tensor(samples[rows[0]].token_ids[P:P + P2]).to(device) if P2 else None
            inner_units += 1
            for g in pack_rows(samples, rows, token_budget):
                mb = _collate([samples[i] for i in g], full_weights[g, P + P2:], pad_id, device, offset=P + P2)
                if prefix is not None:
                    mb["prefix_ids"], mb["prefix_id"] = prefix, torch.tensor(unit)
                if prefix2 is not None:
                    mb["prefix2_ids"], mb["prefix2_id"] = prefix2, torch.tensor(inner_units)
                out.append(mb)
    return out


class _Tail:
    """A row seen from token `offset` on (what `shared_prefixes` reads of it)."""

    def __init__(self, sample: Sample, offset: int) -> None:
        self.token_ids, self.loss_mask = sample.token_ids[offset:], sample.loss_mask[offset:]


def pack_rows(samples: Sequence[Sample], rows: list[int], token_budget: int) -> list[list[int]]:
    """Rows -> micro-batches, longest first, so each holds rows of similar length (little padding).
    A suffix row counts its full length: it attends over the prefix's keys, which are copied per row."""
    groups: list[list[int]] = []
    for i in sorted(rows, key=lambda i: -len(samples[i].token_ids)):
        if groups and (len(groups[-1]) + 1) * len(samples[groups[-1][0]].token_ids) <= token_budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _collate(rows: list[Sample], weights: torch.Tensor, pad_id: int, device: torch.device | str, *,
             offset: int = 0) -> dict[str, torch.Tensor]:
    """Rows from token `offset` on (0, or the length of the prefix they share) -> one micro-batch."""
    T = max(len(s.token_ids) for s in rows) - offset
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    attn = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T - 1)
    old = torch.zeros(len(rows), T - 1)
    temp = torch.ones(len(rows), T - 1)
    for i, s in enumerate(rows):
        n = len(s.token_ids) - offset
        ids[i, :n] = torch.tensor(s.token_ids[offset:])
        attn[i, :n] = 1
        mask[i, : n - 1] = torch.tensor(s.loss_mask[offset + 1:], dtype=torch.float32)
        old[i, : n - 1] = torch.tensor(s.logprobs[offset + 1:], dtype=torch.float32)
        if s.temperatures is not None:
            temp[i, : n - 1] = torch.tensor(s.temperatures[offset + 1:], dtype=torch.float32)
    return {
        "input_ids": ids.to(device), "attention_mask": attn.to(device), "mask": mask.to(device),
        "old_logp": old.to(device), "weights": weights[:, : T - 1].contiguous().to(device),
        "temperature": temp.to(device),
        "advantages": torch.tensor([s.advantage for s in rows]).to(device),
        # the first sampled token of any row: logits before it are never needed
        "first": torch.tensor(min(s.loss_mask.index(1) for s in rows) - offset),
    } | collate_images(rows, device)


def collate_images(rows: list[Sample], device: torch.device | str) -> dict[str, torch.Tensor]:
    """The rows' pixel values and grids, concatenated in row order (the order the model's forward
    matches images to placeholder runs); nothing for text rows."""
    with_images = [s for s in rows if s.image_grid_thw is not None]
    if not with_images:
        return {}
    return {"pixel_values": torch.cat([s.pixel_values for s in with_images]).to(device),  # type: ignore[misc]
            "image_grid_thw": torch.cat([s.image_grid_thw for s in with_images]).to(device)}  # type: ignore[misc]
