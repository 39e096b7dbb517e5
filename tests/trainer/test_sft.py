"""`forge sft`: supervised fine-tuning on recorded trajectories (trainer/sft.py), on the tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest

from openforge.config import TrainerConfig
from openforge.trainer.sft import evaluate_loss, select_examples, train_sft
from tests.helpers.trainer import QA, record_teacher_run

pytestmark = pytest.mark.timeout(300)


def test_sft_lowers_the_loss_on_kept_trajectories_and_the_adapter_loads(store, tiny_model, forge_home):
    source = record_teacher_run(store, tiny_model, rewards=[1.0, 1.0, 1.0, 1.0, 0.0])
    examples = select_examples(store, [source], min_reward=1.0)
    assert sorted(e.task_id for e in examples) == sorted(q for q, _ in QA[:4])  # the failed one is never kept
    assert all(sum(e.loss_mask) == len(e.loss_mask) - e.loss_mask.index(1) for e in examples)  # answer tokens only

    cfg = TrainerConfig(lr=1e-2, lora_r=8, device="cpu")
    run = store.create_run(kind="sft")
    result = train_sft(store, forge_home, run.id, model_path=tiny_model, examples=examples, cfg=cfg, epochs=15,
                       max_tokens=256, val_tasks=1)
    assert result.n_train == 3 and result.n_val == 1
    steps = store.list_train_steps(run.id)
    assert len(steps) == result.steps > 0 and steps[-1].loss < steps[0].loss - 0.4
    assert len(result.val_losses) == 15

    # The saved adapter is a PEFT adapter over the student, and has learnt the answers it was shown.
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    before = evaluate_loss(base, examples, max_tokens=256, device=torch.device("cpu"))
    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32),
                                      str(result.adapter_path))
    after = evaluate_loss(tuned, examples, max_tokens=256, device=torch.device("cpu"))
    assert after < before - 0.4


def test_forge_sft_records_a_run_of_kind_sft(store, tiny_model):
    from typer.testing import CliRunner

    from openforge.forge_cli.main import app

    source = record_teacher_run(store, tiny_model, rewards=[1.0, 0.0, 1.0, 1.0, 0.5])
    out = CliRunner().invoke(app, ["--set", f"engine.model={tiny_model}", "--set", "trainer.device=cpu",
                                   "sft", "--from", source, "--min-reward", "1.0", "--epochs", "2", "--val-tasks", "1"])
    assert out.exit_code == 0, out.output
    assert "adapter " in out.output and "validation loss" in out.output
    run = [r for r in store.list_runs() if r.kind == "sft"][0]
    assert run.status == "finished" and run.summary_json["train_sequences"] == 2
    assert len(store.list_train_steps(run.id)) == run.summary_json["steps"] == 2
    assert (Path(run.summary_json["adapter"]) / "adapter_config.json").is_file()

    nothing = CliRunner().invoke(app, ["--set", f"engine.model={tiny_model}", "sft", "--from", source,
                                       "--min-reward", "2.0"])
    assert nothing.exit_code == 1 and "reached the reward threshold" in nothing.output


def test_forge_sft_defaults_train_on_every_task_at_sfts_own_rate(store, tiny_model):
    """Issue 44: `forge sft` held out one of two demo tasks by default and trained at RL's lr 1e-4. Now every
    task is trained on unless --val-tasks asks, at sft.lr (2e-4; --demo: the demo preset's 3e-3, what
    bench sft_stages measured), and the command says both."""
    from typer.testing import CliRunner

    from openforge.forge_cli.main import app

    source = record_teacher_run(store, tiny_model, rewards=[1.0, 1.0, 0.0, 0.0, 0.0])  # two tasks kept
    out = CliRunner().invoke(app, ["--set", f"engine.model={tiny_model}", "--set", "trainer.device=cpu",
                                   "sft", "--demo", "--from", source, "--epochs", "1"])
    assert out.exit_code == 0, out.output
    assert "on 2 sequences at lr 0.003 (sft.lr)" in out.output and "no task held out" in out.output, out.output
    run = [r for r in store.list_runs() if r.kind == "sft"][0]
    assert run.summary_json["train_sequences"] == 2 and run.summary_json["val_sequences"] == 0
    assert run.config_json["sft"]["lr"] == 3e-3 and run.config_json["trainer"]["lr"] == 3e-3  # the demo's both
    from openforge.config import load_config

    assert load_config(None).sft.lr == 2e-4  # without --demo: LoRA SFT's usual rate, not RL's trainer.lr
