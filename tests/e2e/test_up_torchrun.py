"""`forge up --nproc 2`: the command relaunches itself under torchrun; rank 0 is the run (engine, proxy,
mini rollouts in local sandboxes, the store, checkpoints, adapter publishing) and trains with FSDP2 over
both ranks (gloo on CPU); rank 1 follows."""

from __future__ import annotations

from pathlib import Path

import pytest

from openforge.store import Store
from tests.helpers.up import SMALL, home_with_model, served_with_adapter, spawn  # noqa: F401 - fixture


@pytest.mark.slow
def test_forge_up_demo_headless_trains_on_2_ranks_and_publishes_adapters(home_with_model: Path) -> None:
    home = home_with_model
    proc = spawn(home, *SMALL, "up", "--demo", "--headless", "--steps", "2", "--nproc", "2")
    try:
        stdout, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stdout[-5000:]
    assert "step 0 (1 of 2)" in stdout and "step 1 (2 of 2)" in stdout
    store = Store(home / "forge.db")
    run = store.get_run("latest")
    assert run.status == "finished" and run.config_json["trainer"]["nproc"] == 2
    assert run.owner_pid != proc.pid  # the run was rank 0's, a child torchrun started, not this command's
    assert run.config_json["harness"]["name"] == "mini"  # the demo's settings reached rank 0
    steps = store.list_train_steps(run.id)
    assert [s.step for s in steps] == [0, 1] and all(s.loss is not None and s.n_tokens > 0 for s in steps)
    # rank 0 published each step's adapter (gathered from both ranks) and the engine served step 0's in step 1
    assert [c.loaded for c in store.list_checkpoints(run.id)] == [True, True]
    assert served_with_adapter(store, run.id, 1, f"{run.id}-step-0")
    assert run.current_adapter == f"{run.id}-step-1"
    assert (home / "runs" / run.id / "adapters" / "step-1" / "adapter_model.safetensors").is_file()


def test_each_rank_gets_the_same_forge_up_invocation(tmp_path: Path) -> None:
    """What the parent hands torchrun: the root options, then `up` with every given option, parsed back."""
    import typer

    from openforge.forge_cli.context import AppState, rank_argv
    from openforge.forge_cli.main import app

    argv = ["--home", str(tmp_path), "--set", "runner.concurrency=2", "up", "--demo", "--headless",
            "--steps", "2", "--name", "x y", "--harness", "mini", "--nproc", "2"]
    root = typer.main.get_command(app)
    ctx = root.make_context("forge", list(argv), resilient_parsing=True)
    ctx.obj = AppState(home_override=str(tmp_path), config_path=None, sets=["runner.concurrency=2"])
    sub = root.get_command(ctx, "up").make_context("up", argv[5:], parent=ctx)  # type: ignore[union-attr]
    assert rank_argv(sub) == argv and rank_argv(sub, nproc=3)[-2:] == ["--nproc", "3"]
    assert (sub.params["demo"], sub.params["headless"], sub.params["stay"]) == (True, True, False)
    assert (sub.params["steps"], sub.params["nproc"], sub.params["name"], sub.params["resume"]) == (2, 2, "x y", None)
