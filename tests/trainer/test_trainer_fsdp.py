"""The trainer under torchrun with FSDP2 (trainer/distributed.py): 2 ranks on CPU (gloo) give the same
losses, metrics and final LoRA weights as the ordinary one-process trainer on the same batches."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.paths import REPO
from tests.trainer import fsdp_worker as w
from openforge.trainer.data import micro_batches
from openforge.trainer.grpo import grpo_step
from openforge.trainer.model import build_optimizer, build_policy

# fp32; the ranks sum their gradients in another order than one process does. Measured: metrics
# (loss, grad norm, mismatch) equal to 1e-7 relative, weights after 3 AdamW steps identical (0.0:
# Adam's first steps are ~lr * sign(g), blind to 1e-7 differences)
WEIGHT_ATOL, METRIC_REL = 1e-5, 1e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_process(model_dir: Path) -> tuple[list[dict], dict[str, torch.Tensor]]:
    torch.manual_seed(w.CFG.seed)
    model = build_policy(model_dir, w.CFG, device=torch.device("cpu"))
    opt, sched = build_optimizer(model, w.CFG)
    metrics = []
    for step in range(w.STEPS):
        mbs = micro_batches(w.batches(step), token_budget=w.CFG.micro_batch_tokens, pad_id=0, loss_agg=w.STEP.loss_agg)
        metrics.append(grpo_step(model, opt, mbs, w.STEP, sched))
    return metrics, {k: v.detach().flatten() for k, v in model.state_dict().items() if "lora_" in k}


@pytest.mark.slow
def test_two_fsdp_ranks_equal_one_process(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "fsdp.json"
    env = {**os.environ, "PYTHONPATH": str(REPO),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
         "--master_port", str(_free_port()), str(Path(__file__).parent / "fsdp_worker.py"), str(tiny_model), str(out)],
        env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["world"] == 2
    want_metrics, want_lora = _one_process(tiny_model)
    for mine, ref in zip(got["metrics"], want_metrics):
        assert mine["n_tokens"] == ref["n_tokens"]
        for key in ("loss", "mismatch_mean", "mismatch_max", "mismatch_kl", "mismatch_ratio_max", "grad_norm", "entropy"):
            assert mine[key] == pytest.approx(ref[key], rel=METRIC_REL, abs=1e-9), key
    by_suffix = {k.replace(".default", ""): v for k, v in want_lora.items()}
    moved = worst = 0.0
    assert {k.replace(".default", "") for k in got["lora"]} == set(by_suffix)
    for key, values in got["lora"].items():
        ref = by_suffix[key.replace(".default", "")]
        worst = max(worst, float((torch.tensor(values) - ref).abs().max()))
        moved = max(moved, float(ref.abs().max()))
    print(f"\nmax |w_2ranks - w_1process| = {worst:.1e} (largest weight {moved:.1e})")
    assert worst <= WEIGHT_ATOL
    assert moved > 1e-3  # the steps did change the adapter (B starts at zero)


def test_docstring_examples_hold() -> None:
    import doctest

    from openforge.trainer import distributed

    result = doctest.testmod(distributed)
    assert result.attempted >= 1 and result.failed == 0
