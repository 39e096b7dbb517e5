"""Per-rollout normalisation: a rollout split into many segments weighs what a one-segment rollout does.

A segment is a training row (trainer/data.py); a harness that compacts its context, runs sub-agents
or rewrites its history splits one rollout into several. Normalising per row (veRL's seq-mean over
rows, the weighting Agent Lightning fixed in its per-rollout mean) lets the split rollout count once
per row; here each rollout's share of the loss is fixed by its rollout, whatever the split.
"""

from __future__ import annotations

import pytest
import torch

from openforge.store import Store, Trajectory
from openforge.trainer.data import build_batch, micro_batches
from openforge.trainer.grpo import aggregation_weights


def _rollout_mass(mbs: list[dict[str, torch.Tensor]], rows: list[str]) -> dict[str, float]:
    """Each rollout's total loss weight, summed over the rows of every micro-batch."""
    out: dict[str, float] = {}
    k = 0
    for mb in mbs:
        for w in (mb["weights"] * mb["mask"]).sum(dim=1).tolist():
            out[rows[k]] = out.get(rows[k], 0.0) + w
            k += 1
    return out


@pytest.mark.parametrize("loss_agg", ["seq-mean", "token-mean"])
def test_a_rollout_in_four_segments_weighs_what_a_one_segment_rollout_does(store: Store, loss_agg: str) -> None:
    run = store.create_run()
    whole = store.update_rollout(store.create_rollout(run_id=run.id, task_id="t").id, status="scored", reward=1.0)
    split = store.update_rollout(store.create_rollout(run_id=run.id, task_id="t").id, status="scored", reward=0.0)
    trajs = [Trajectory(run_id=run.id, rollout_id=whole.id, segment=0, token_ids=list(range(10, 22)),
                        loss_mask=[0] * 4 + [1] * 8, logprobs=[0.0] * 4 + [-1.0] * 8)]
    for seg in range(4):  # the same 8 sampled tokens, 2 per segment (a compaction before each)
        trajs.append(Trajectory(run_id=run.id, rollout_id=split.id, segment=seg, token_ids=[5, 6, 7, 30 + seg, 40 + seg],
                                loss_mask=[0, 0, 0, 1, 1], logprobs=[0.0, 0.0, 0.0, -1.0, -1.0]))
    batch = build_batch([whole, split], trajs)
    assert len(batch.samples) == 5
    # a budget of 1 token: one row per micro-batch, longest first; the weights are the whole step's
    full = micro_batches(batch.samples, token_budget=1, pad_id=0, loss_agg=loss_agg)
    rows = [s.rollout_id for s in sorted(batch.samples, key=lambda s: -len(s.token_ids))]
    mass = _rollout_mass(full, rows)
    assert mass[whole.id] == pytest.approx(0.5) and mass[split.id] == pytest.approx(0.5)
    assert sum(mass.values()) == pytest.approx(1.0)
    # Per-row normalisation (what this guards against): the split rollout would carry 4/5 of the loss.
    mask = torch.tensor([[1.0] * 8, [1.0, 1.0] + [0.0] * 6, [1.0, 1.0] + [0.0] * 6, [1.0, 1.0] + [0.0] * 6,
                         [1.0, 1.0] + [0.0] * 6])
    per_row = (aggregation_weights(mask, "seq-mean") * mask).sum(dim=1)
    assert float(per_row[0]) == pytest.approx(0.2) and float(per_row[1:].sum()) == pytest.approx(0.8)
