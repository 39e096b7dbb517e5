"""`forge up/train --init-from RUN_OR_PATH`: RL that starts from an adapter (an SFT result), trained by
the trainer and served by the engine from step 0; bad adapters refused in one line before a run exists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from openforge.config import TrainerConfig
from openforge.forge_cli.main import app
from openforge.store import Store

pytestmark = pytest.mark.timeout(300)
ONE_ROLLOUT = ["--set", "runner.samples_per_task=2", "--set", "trainer.tasks_per_step=1", "--set",
               "runner.concurrency=2", "--set", "trainer.device=cpu", "--set", "tasks.include=[\"easy-sum\"]"]


def lora_weights(model) -> dict[str, torch.Tensor]:  # noqa: ANN001
    return {k.replace(".default", ""): v.detach().clone() for k, v in model.state_dict().items() if "lora_" in k}


def save_adapter(tiny_model: Path, out: Path, *, r: int = 8) -> dict[str, torch.Tensor]:
    """A LoRA adapter of rank `r` with non-zero B (as a trained one has), saved with PEFT."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=r, lora_alpha=16, target_modules=TrainerConfig().lora_target_modules,
                                            init_lora_weights=False, task_type="CAUSAL_LM"))
    model.save_pretrained(out)
    return lora_weights(model)


@pytest.fixture(scope="module")
def task_id() -> str:
    from openforge.rollouts.tasks.format import load_tasks

    ids = [t.id for t in load_tasks("builtin")]
    assert "easy-sum" in ids, ids
    return "easy-sum"


def test_the_policy_starts_from_the_adapter_and_a_mismatch_is_refused(tiny_model: Path, tmp_path: Path) -> None:
    from openforge.errors import ConfigError
    from openforge.trainer.model import build_policy

    saved = save_adapter(tiny_model, tmp_path / "sft")
    model = build_policy(tiny_model, TrainerConfig(init_from=str(tmp_path / "sft")), device=torch.device("cpu"))
    got = lora_weights(model)
    assert got.keys() == saved.keys() and all(torch.equal(got[k], saved[k]) for k in saved)
    assert all(p.requires_grad for n, p in model.named_parameters() if "lora_" in n)  # trainable, not frozen
    with pytest.raises(ConfigError, match=r"the adapter is LORA r=8 .* the run trains LoRA r=4"):
        build_policy(tiny_model, TrainerConfig(init_from=str(tmp_path / "sft"), lora_r=4), device=torch.device("cpu"))


def test_forge_train_init_from_serves_the_adapter_from_step_0(forge_home: Path, tiny_model: Path, tmp_path: Path,
                                                               task_id: str) -> None:
    from openforge.trainer.checkpoint import save_checkpoint
    from openforge.trainer.model import build_optimizer, build_policy

    store = Store(forge_home / "forge.db")
    # An SFT run's result, where trainer/sft.py leaves it: runs/<run>/adapters/step-N (+ its checkpoint).
    saved = save_adapter(tiny_model, tmp_path / "adapter")
    cfg = TrainerConfig(init_from=str(tmp_path / "adapter"), device="cpu")
    policy = build_policy(tiny_model, cfg, device=torch.device("cpu"))
    optimizer, scheduler = build_optimizer(policy, cfg)
    sft = store.create_run(kind="sft")
    adapter = save_checkpoint(forge_home, sft.id, 3, model=policy, optimizer=optimizer, scheduler=scheduler,
                              state={"kind": "sft"})
    store.set_run_status(sft.id, "finished")

    out = CliRunner().invoke(app, ["--set", f"engine.model={tiny_model}", *ONE_ROLLOUT, "train", "--steps", "1",
                                   "--init-from", sft.id[:12]])
    assert out.exit_code == 0, out.output
    run = [r for r in store.list_runs() if r.kind == "train"][0]
    assert run.status == "finished"
    assert run.config_json["trainer"]["init_from"] == str(adapter.resolve())  # stored: a resume starts from it
    rollouts = store.list_rollouts(run.id)
    assert rollouts and {r.adapter for r in rollouts} == {f"{run.id}-init"}
    calls = store.list_calls(run_id=run.id)
    assert calls and {c.adapter for c in calls} == {f"{run.id}-init"}  # step 0 sampled by the SFT policy
    assert run.current_adapter == f"{run.id}-step-0"
    # The adapter the run saved after one step is the SFT adapter moved by one update, not a fresh LoRA.
    from safetensors.torch import load_file

    stepped = load_file(forge_home / "runs" / run.id / "adapters" / "step-0" / "adapter_model.safetensors")
    for key, value in saved.items():
        name = next(k for k in stepped if key.split("base_model.model.")[-1].replace(".weight", "") in k)
        assert torch.allclose(stepped[name], value, atol=0.05), name  # a fresh LoRA has B = 0


@pytest.mark.parametrize("case", ["no such path", "run without adapter", "rank mismatch", "not an adapter"])
def test_a_bad_init_from_is_one_line_before_any_run(case: str, forge_home: Path, tiny_model: Path,
                                                     tmp_path: Path) -> None:
    store = Store(forge_home / "forge.db")
    target, expect = {
        "no such path": (str(tmp_path / "missing"), "neither an adapter folder nor a run"),
        "not an adapter": (str(tmp_path), "not a PEFT adapter folder"),
    }.get(case, (None, None))
    if case == "run without adapter":
        run = store.create_run(kind="sft")
        store.set_run_status(run.id, "failed", error="no data")
        target, expect = run.id, "saved no LoRA adapter"
    elif case == "rank mismatch":
        save_adapter(tiny_model, tmp_path / "r4", r=4)
        target, expect = str(tmp_path / "r4"), "the adapter is LORA r=4"
    before = {r.id for r in store.list_runs()}
    out = CliRunner().invoke(app, ["--set", f"engine.model={tiny_model}", *ONE_ROLLOUT, "train", "--steps", "1",
                                   "--init-from", target])
    assert out.exit_code == 1, out.output
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("forge: error: --init-from ") and expect in line, line
    assert {r.id for r in store.list_runs()} == before  # refused before a run existed
