"""Image rows under torchrun with FSDP2 (trainer/distributed.py, issue 18): the real training loop on
the tiny Qwen2-VL, 2 CPU ranks on gloo, against the same loop in one process on the same rollouts.

- step 0 is a batch of image rows only (one to two images a row, grids of 4 to 30 tokens), step 1
  a mixed text + image batch; both ranks record the same loss and token count as one process and
  end each step with the same LoRA weights
- rank 1 really ran image micro-batches: its pixel values are re-created from the bytes rank 0
  shipped (a wrong or missing pixel would change the loss), checked by the packing both ranks share
- the vision tower stays outside FSDP (whole on every rank, frozen), so a rank running the tower
  next to a rank on a text-only micro-batch issues the same collectives
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.trainer import vl_dist_worker as w
from openforge.store import Store
from tests.helpers.trainer import _lora_state
from openforge.trainer.data import build_batch, micro_batches
from openforge.trainer.distributed import split_by_tokens
from openforge.trainer.loop import train
from openforge.trainer.vision import TrajectoryImages

# fp32 on gloo: the ranks sum their gradients in another order than one process (two partial sums,
# then gloo's sum), so gradients differ by rounding (~1e-7 relative). Loss and grad norm: measured
# equal to ~1e-8 relative. Weights: AdamW's first steps move each weight by lr * g / (|g| + eps),
# which is blind to that rounding except where a gradient element nearly cancels (a GRPO group's
# advantages sum to zero): measured, 1 of 256 elements of one matrix off by 2.6e-6 after step 0 and
# at most 15 of 512 off by up to 8.8e-6 after step 1; all others within 1e-7. So: every weight
# within 5e-5 (a quarter of a percent of one step of lr 2e-2), and 99% of them within 1e-6.
LOSS_REL, WEIGHT_MAX, WEIGHT_BULK = 1e-5, 5e-5, 1e-6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_image_rows_train_under_two_fsdp_ranks_as_in_one_process(store: Store, tiny_vl_model: Path,
                                                                 forge_home: Path) -> None:
    run = store.create_run(name="vl-dist")
    env = {**os.environ, "FORGE_HOME": str(forge_home), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
         "--master_port", str(_free_port()), str(Path(w.__file__)), str(store.path), run.id, str(tiny_vl_model),
         str(forge_home)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]

    ref = store.create_run(name="vl-one-process")
    train(store, ref.id, w.cfg(), model_path=tiny_vl_model, tasks=w.TASKS, home=forge_home,
          sampler=w.ImageReplaySampler(store, forge_home, tiny_vl_model))

    got, want = (sorted(store.list_train_steps(r), key=lambda s: s.step) for r in (run.id, ref.id))
    assert [s.step for s in got] == [0, 1]
    assert [s.n_tokens for s in got] == [s.n_tokens for s in want]
    assert [s.loss for s in got] == pytest.approx([s.loss for s in want], rel=LOSS_REL, abs=1e-9)
    assert [s.grad_norm for s in got] == pytest.approx([s.grad_norm for s in want], rel=LOSS_REL)
    for step in range(w.STEPS):
        a, b = _lora_state(forge_home, run.id, step), _lora_state(forge_home, ref.id, step)
        assert set(a) == set(b) and all("language_model" in k for k in a)
        diff = torch.cat([(a[k] - b[k]).abs().flatten() for k in sorted(a)])
        bulk = float(diff.quantile(0.99))
        print(f"\nstep {step}: loss {got[step].loss:.8f} vs {want[step].loss:.8f}, grad norm {got[step].grad_norm:.6f} "
              f"vs {want[step].grad_norm:.6f}; |w_2 - w_1| max {float(diff.max()):.1e}, 99th percentile {bulk:.1e}")
        assert float(diff.max()) <= WEIGHT_MAX and bulk <= WEIGHT_BULK
    assert max(float(v.abs().max()) for k, v in a.items() if "lora_B" in k) > 1e-3  # training moved B off zero

    # What each rank ran, from the packing every rank shares: rank 1 had image rows in both steps, and
    # step 1 mixed text rows in.
    vision = TrajectoryImages.for_run(forge_home, run.id, tiny_vl_model)
    for step in range(w.STEPS):
        rollouts = [r for r in store.list_rollouts(run.id) if r.step == step]
        trajs = store.list_trajectories(rollout_ids=[r.id for r in rollouts])
        assert all(bool(t.images) == (step == 0 or t.images is not None) for t in trajs)
        samples = build_batch(rollouts, trajs, vision=vision).samples
        mbs = micro_batches(samples, token_budget=w.cfg().micro_batch_tokens, pad_id=0, loss_agg="seq-mean")
        share = split_by_tokens(mbs, 2)[1]
        assert any("pixel_values" in mbs[i] for i in share), step
        if step == 1:
            assert any(s.image_grid_thw is None for s in samples) and any(s.image_grid_thw is not None for s in samples)
