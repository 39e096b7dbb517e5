"""`forge export RUN --format peft|merged`: a run's checkpoint leaves as a PEFT folder and as merged
weights, both loaded back with transformers/peft and compared, logit for logit, with the checkpoint
loaded the way the trainer loads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from openforge.config import ForgeConfig, TrainerConfig
from openforge.forge_cli.main import app
from openforge.store import Checkpoint, Store
from openforge.trainer.checkpoint import save_checkpoint
from openforge.trainer.model import build_policy

CPU = torch.device("cpu")
PROMPT = [{"role": "user", "content": "What is 2 + 3?"}]


def _run_with_checkpoints(store: Store, home: Path, tiny_model: Path, *, full: bool = False,
                          steps: tuple[int, ...] = (0, 1), kind: str = "train") -> str:
    """A run whose trainer saved `steps` with save_checkpoint, each a different random update (LoRA B
    starts at zero, which would make the merge a no-op and the test blind)."""
    config = ForgeConfig.model_validate({"engine": {"model": str(tiny_model)}, "trainer": {"full_finetune": full}})
    run = store.create_run(kind=kind, name="export-models", config=config.model_dump(mode="json"))
    model = build_policy(tiny_model, config.trainer, device=CPU)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    torch.manual_seed(0)
    for step in steps:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.requires_grad and (full or "lora_" in name):
                    p.add_(torch.randn_like(p) * 0.05)
        path = save_checkpoint(home, run.id, step, model=model, optimizer=optimizer, scheduler=None, state={})
        if kind == "train":  # `forge sft` saves its adapters the same way but records no checkpoint row
            store.add_checkpoint(Checkpoint(run_id=run.id, step=step, kind="full" if full else "adapter",
                                            path=str(path)))
    return run.id


def _ids(folder: Path) -> torch.Tensor:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    ids = tok.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    return torch.tensor([ids])


@torch.no_grad()
def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    model.eval()
    return model(input_ids=ids).logits


def _export(run_id: str, *args: str) -> str:
    res = CliRunner().invoke(app, ["export", run_id, *args])
    assert res.exit_code == 0, res.output
    return res.output


def test_peft_and_merged_exports_load_and_match_the_trainers_checkpoint(store: Store, forge_home: Path,
                                                                       tiny_model: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run_id = _run_with_checkpoints(store, forge_home, tiny_model)
    ids = _ids(tiny_model)
    base_logits = _logits(AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32), ids)
    for step in (0, 1):
        own = _logits(build_policy(tiny_model, TrainerConfig(), device=CPU,
                                   resume_from=forge_home / "runs" / run_id / "adapters" / f"step-{step}"), ids)
        assert not torch.allclose(own, base_logits, atol=1e-3)  # the adapter changes the model

        peft_dir, merged_dir = tmp_path / f"peft-{step}", tmp_path / f"merged-{step}"
        out = _export(run_id, "--format", "peft", "--step", str(step), "--out", str(peft_dir))
        assert f"step {step} of {run_id}" in out
        assert sorted(p.name for p in peft_dir.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
        base = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
        torch.testing.assert_close(_logits(PeftModel.from_pretrained(base, str(peft_dir)), ids), own,
                                   rtol=0, atol=1e-6)

        _export(run_id, "--format", "merged", "--step", str(step), "--out", str(merged_dir))
        assert list(merged_dir.glob("*.safetensors")) and not list(merged_dir.glob("adapter_*"))
        merged = AutoModelForCausalLM.from_pretrained(str(merged_dir))
        assert merged.dtype == torch.float32  # the base checkpoint's dtype
        # The tokenizer and its chat template travel with the weights: the prompt tokenizes the same.
        assert torch.equal(_ids(merged_dir), ids)
        torch.testing.assert_close(_logits(merged, ids), own, rtol=1e-5, atol=1e-5)

    # Without --step: the newest checkpoint.
    assert "step 1 of" in _export(run_id, "--format", "peft", "--out", str(tmp_path / "newest"))
    assert not list(tmp_path.glob("*.partial"))  # written beside, renamed into place


def test_a_full_finetune_exports_merged_and_refuses_peft(store: Store, forge_home: Path, tiny_model: Path,
                                                        tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    run_id = _run_with_checkpoints(store, forge_home, tiny_model, full=True, steps=(0,))
    ids = _ids(tiny_model)
    own = _logits(build_policy(tiny_model, TrainerConfig(full_finetune=True), device=CPU,
                               resume_from=forge_home / "runs" / run_id / "adapters" / "step-0"), ids)
    out = _export(run_id, "--format", "merged", "--out", str(tmp_path / "full"))
    assert "full fine-tune of step 0" in out
    assert json.loads((tmp_path / "full" / "config.json").read_text())["model_type"] == "qwen2"
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "full"))
    torch.testing.assert_close(_logits(merged, ids), own, rtol=0, atol=1e-6)
    assert torch.equal(_ids(tmp_path / "full"), ids)

    res = CliRunner().invoke(app, ["export", run_id, "--format", "peft", "--out", str(tmp_path / "p")])
    assert res.exit_code != 0 and "trained all weights" in res.output


def test_an_sft_run_exports_its_saved_adapters(store: Store, forge_home: Path, tiny_model: Path,
                                               tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run_id = _run_with_checkpoints(store, forge_home, tiny_model, steps=(0, 3), kind="sft")
    assert store.list_checkpoints(run_id) == []
    assert "adapter of step 3 of" in _export(run_id, "--format", "peft", "--out", str(tmp_path / "sft"))
    own = _logits(build_policy(tiny_model, TrainerConfig(), device=CPU,
                               resume_from=forge_home / "runs" / run_id / "adapters" / "step-3"), _ids(tiny_model))
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    got = _logits(PeftModel.from_pretrained(base, str(tmp_path / "sft")), _ids(tiny_model))
    torch.testing.assert_close(got, own, rtol=0, atol=1e-6)


@pytest.mark.parametrize("case", ["unknown run", "no checkpoint", "step not found", "out not empty", "step on jsonl"])
def test_bad_exports_are_one_clear_line(store: Store, forge_home: Path, tiny_model: Path, tmp_path: Path,
                                        case: str) -> None:
    out = tmp_path / "out"
    if case == "unknown run":
        args, want = ["nosuchrun", "--format", "peft"], "nosuchrun"
    elif case == "no checkpoint":
        run = store.create_run(kind="train", config=ForgeConfig().model_dump(mode="json"))
        args, want = [run.id, "--format", "merged"], "has no checkpoint to export"
    elif case == "step not found":
        run_id = _run_with_checkpoints(store, forge_home, tiny_model, steps=(0,))
        args, want = [run_id, "--format", "peft", "--step", "7"], "no checkpoint of step 7 (it has step 0)"
    elif case == "out not empty":
        run_id = _run_with_checkpoints(store, forge_home, tiny_model, steps=(0,))
        out.mkdir()
        (out / "keep.txt").write_text("mine")
        args, want = [run_id, "--format", "merged"], "is not an empty folder"
    else:
        args, want = ["latest", "--format", "jsonl", "--step", "1"], "--step picks a checkpoint"
    res = CliRunner().invoke(app, ["export", *args, "--out", str(out)])
    assert res.exit_code != 0
    assert want in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1, res.output
    if case == "out not empty":
        assert [p.name for p in out.iterdir()] == ["keep.txt"]
