"""Run under torchrun by tests/trainer/test_trainer_fsdp.py: a few GRPO steps with FSDP2 on fixed batches;
rank 0 writes the metrics and the final LoRA weights as JSON. `python fsdp_worker.py MODEL OUT`."""

from __future__ import annotations

import json
import sys

import torch

from openforge.config import TrainerConfig
from openforge.trainer.data import micro_batches
from openforge.trainer.distributed import broadcast, distributed_step, init, leave, shard
from openforge.trainer.grpo import StepConfig
from openforge.trainer.model import build_optimizer, build_policy

STEPS = 3
CFG = TrainerConfig(lora_r=4, lora_alpha=8, lr=1e-2, seed=0, micro_batch_tokens=40)
STEP = StepConfig(loss_agg="seq-mean", max_grad_norm=0.5, entropy_coef=0.01)  # the entropy bonus sharded too


def batches(step: int) -> list:
    """The samples of step `step` (the same in every process that asks)."""
    sys.path.insert(0, __file__.rsplit("/", 3)[0])  # the repository: tests.* imports
    from tests.helpers.trainer import _samples

    return _samples(9, seed=step)


def lora_state(model) -> dict[str, list[float]]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.flatten().tolist() for k, v in full.items() if "lora_" in k}


def main(model_dir: str, out: str) -> None:
    d = init()
    torch.manual_seed(CFG.seed)
    model = shard(build_policy(model_dir, CFG, device=d.device))
    opt, sched = build_optimizer(model, CFG)
    metrics = []
    for step in range(STEPS):
        samples = broadcast(batches(step) if d.is_main else None, d)
        mbs = micro_batches(samples, token_budget=CFG.micro_batch_tokens, pad_id=0, loss_agg=STEP.loss_agg)
        metrics.append(distributed_step(model, opt, mbs, STEP, d, sched))
    state = lora_state(model)
    if d.is_main:
        with open(out, "w") as f:
            json.dump({"metrics": metrics, "lora": state, "world": d.world}, f)
    leave()  # rank 1 would otherwise tear down while rank 0 is still in the state-dict gather


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
