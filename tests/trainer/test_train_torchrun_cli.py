"""`forge train --nproc 2` end to end: the command relaunches itself under torchrun; rank 0 brings up the
real engine, proxy and mini rollouts in local sandboxes and trains with FSDP2 over both ranks (gloo)."""

from __future__ import annotations

from pathlib import Path

import pytest

from openforge.store import Store
from tests.helpers.up import forge, home_with_model, served_with_adapter  # noqa: F401 - fixture

CONFIG = """
[engine]
kind = "embedded"
max_batch_size = 4
[sandbox]
type = "local"
[harness]
name = "mini"
max_turns = 2
max_tokens = 1
[tasks]
path = "builtin"
include = ["easy-sum"]
[runner]
samples_per_task = 2
concurrency = 2
[proxy]
default_max_tokens = 1
max_context_tokens = 4096
[trainer]
tasks_per_step = 1
lr = 5e-3
micro_batch_tokens = 2048
"""


@pytest.mark.slow
def test_forge_train_nproc_2_runs_under_torchrun(home_with_model: Path) -> None:
    home = home_with_model
    (home / "forge.toml").write_text(CONFIG)
    out = forge(home, "train", "--nproc", "2", "--steps", "2", timeout=400)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    store = Store(home / "forge.db")
    run = store.get_run("latest")
    assert run.status == "finished" and run.config_json["trainer"]["nproc"] == 2
    steps = store.list_train_steps(run.id)
    assert [s.step for s in steps] == [0, 1] and all(s.loss is not None and s.n_tokens > 0 for s in steps)
    # rank 0 published each step's adapter (gathered from both ranks) and the engine served it
    assert [c.loaded for c in store.list_checkpoints(run.id)] == [True, True]
    assert served_with_adapter(store, run.id, 1, f"{run.id}-step-0")
    assert (home / "runs" / run.id / "adapters" / "step-1" / "adapter_model.safetensors").is_file()


def test_nproc_flag_is_validated(home_with_model: Path) -> None:
    out = forge(home_with_model, "train", "--nproc", "0", timeout=60)
    assert out.returncode == 2 and "Invalid value for '--nproc'" in out.stderr


def test_each_rank_gets_the_same_forge_train_invocation(tmp_path: Path) -> None:
    """What the parent hands torchrun: the root options, then `train` with every given option."""
    import typer

    from openforge.forge_cli.context import AppState, rank_argv
    from openforge.forge_cli.main import app
    from torch.distributed.run import get_args_parser
    from openforge.trainer.launch import torchrun_args

    argv = ["--home", str(tmp_path), "--config", "forge.toml", "--set", "runner.concurrency=2", "train",
            "--steps", "3", "--lr", "0.01", "--group-size", "4", "--lora", "--overlap", "--name", "x y",
            "--nproc", "2"]
    root = typer.main.get_command(app)
    ctx = root.make_context("forge", list(argv), resilient_parsing=True)
    ctx.obj = AppState(home_override=str(tmp_path), config_path="forge.toml", sets=["runner.concurrency=2"])
    assert ctx.params["home"] == str(tmp_path) and ctx.params["set_"] == ["runner.concurrency=2"]
    sub = root.get_command(ctx, "train").make_context("train", argv[7:], parent=ctx)  # type: ignore[union-attr]
    assert rank_argv(sub) == argv
    assert sub.params["nproc"] == 2 and sub.params["overlap"] is True and sub.params["full_finetune"] is False
    assert sub.params["name"] == "x y" and sub.params["group_size"] == 4 and sub.params["resume"] is None
    parsed = get_args_parser().parse_args(torchrun_args(2, [], port=29511))
    assert (parsed.nproc_per_node, parsed.master_addr, parsed.master_port, parsed.max_restarts) == ("2", "127.0.0.1", 29511, 0)
    assert parsed.module and parsed.training_script == "openforge.forge_cli.main"
