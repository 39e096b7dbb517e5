"""`forge sft --nproc 2`: the command relaunches itself under torchrun and trains with FSDP2 over both
ranks (gloo on CPU), each rank running its share of every packed row (trainer/sft_ranks.py). The same
data in one process and on two ranks give the same losses step by step, the same validation losses and
the same adapter, within float tolerance: the split changes the order of sums, not the math.

`forge sft --resume RUN` continues a run that died after an epoch's checkpoint (here: its later
checkpoints removed, as a kill before writing them leaves it) and ends where the uninterrupted run
ended, on two ranks or one (checkpoints are in the one-process format either way)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from openforge.forge_cli.main import app
from openforge.store import Store
from tests.helpers.trainer import record_teacher_run
from tests.helpers.up import forge

pytestmark = pytest.mark.timeout(600)
SETS = ["--set", "trainer.device=cpu", "--set", "sft.max_tokens=64", "--set", "trainer.lr=1e-2"]


def sets(tiny_model: Path) -> list[str]:
    # 64-token rows: two or three sequences a row, so every step is split between the ranks
    return ["--set", f"engine.model={tiny_model}", *SETS]


def die_after_first_epoch(home: Path, store: Store, run_id: str) -> int:
    """Leave `run_id` as a kill after its first epoch's checkpoint would: the later checkpoints gone,
    the run interrupted. Returns the step of the checkpoint left."""
    ckpts = sorted(int(p.name.split("-")[1]) for p in (home / "runs" / run_id / "checkpoints").iterdir())
    assert len(ckpts) == 2  # one per epoch
    for step in ckpts[1:]:
        shutil.rmtree(home / "runs" / run_id / "checkpoints" / f"step-{step}")
        shutil.rmtree(home / "runs" / run_id / "adapters" / f"step-{step}")
    store.set_run_status(run_id, "interrupted")
    return ckpts[0]


def same_adapter(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """The same LoRA weights within float tolerance: Adam's step amplifies the last bits of a gradient
    whose sums ran in another order (torchrun's ranks run one thread each, this process two)."""
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-3, atol=2e-4)


def test_resume_refuses_what_it_cannot_continue(store: Store, tiny_model: Path) -> None:
    done = store.create_run(kind="sft")
    store.set_run_status(done.id, "finished")
    train = store.create_run(kind="train")
    store.set_run_status(train.id, "failed")
    for args, said in ((["--resume", done.id], f"run {done.id} is finished: nothing to resume"),
                       (["--resume", train.id], f"run {train.id} is of kind train; --resume continues a forge sft run"),
                       (["--resume", done.id, "--from", train.id], "give the data with --from RUN, or continue an "
                                                                   "sft run with --resume RUN (not both)"),
                       ([], "give the data with --from RUN, or continue an sft run with --resume RUN (not both)")):
        out = CliRunner().invoke(app, [*sets(tiny_model), "sft", *args])
        assert out.exit_code == 1 and out.stderr.strip() == f"forge: error: {said}", out.output


@pytest.mark.slow  # two `forge sft` runs on two torchrun ranks, two in this process: ~60 s on 2 idle cores
def test_forge_sft_on_two_ranks_equals_one_process_and_resumes(store: Store, tiny_model: Path,
                                                               forge_home: Path) -> None:
    source = record_teacher_run(store, tiny_model, rewards=[1.0, 1.0, 1.0, 1.0, 1.0])
    out = CliRunner().invoke(app, [*sets(tiny_model), "sft", "--from", source, "--epochs", "2", "--val-tasks", "1"])
    assert out.exit_code == 0, out.output
    one = next(r for r in store.list_runs() if r.kind == "sft")
    out = forge(forge_home, *sets(tiny_model), "sft", "--from", source, "--epochs", "2", "--val-tasks", "1",
                "--nproc", "2", timeout=500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    two = store.list_runs()[0]
    assert two.kind == "sft" and two.id != one.id and two.status == "finished"
    assert two.config_json["trainer"]["nproc"] == 2
    steps = {1: store.list_train_steps(one.id), 2: store.list_train_steps(two.id)}
    assert len(steps[2]) == len(steps[1]) == one.summary_json["steps"] >= 4
    assert [s.n_tokens for s in steps[2]] == [s.n_tokens for s in steps[1]]  # the same rows, whole on rank 0
    assert [s.loss for s in steps[2]] == pytest.approx([s.loss for s in steps[1]], rel=1e-4)
    assert steps[1][-1].loss < steps[1][0].loss  # it learns: the equal losses are not a constant
    assert two.summary_json["val_losses"] == pytest.approx(one.summary_json["val_losses"], rel=1e-4)
    assert len(one.summary_json["val_losses"]) == 2
    # rank 0 saved the gathered adapter in the one-process format: the same weights, the same names
    final = {n: load_file(Path(r.summary_json["adapter"]) / "adapter_model.safetensors") for n, r in ((1, one), (2, two))}
    same_adapter(final[1], final[2])

    # Resumed after the first epoch, on two ranks (rank 0 loads the checkpoint, the other rank gets its
    # weights and optimizer state by broadcast) and in one process: each ends where it would have.
    for run, nproc in ((two, 2), (one, 1)):
        kept = die_after_first_epoch(forge_home, store, run.id)
        out = forge(forge_home, *sets(tiny_model), "sft", "--resume", run.id, "--nproc", str(nproc), timeout=500)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        assert f"step {kept}  " not in out.stdout and f"step {kept + 1}  " in out.stdout  # no step trained twice
        again = store.get_run(run.id)
        assert again.status == "finished" and again.summary_json["steps"] == len(steps[1])
        redone = store.list_train_steps(run.id)
        assert [s.step for s in redone] == list(range(1, len(steps[1]) + 1))
        assert [s.loss for s in redone] == pytest.approx([s.loss for s in steps[1]], rel=1e-4)
        assert again.summary_json["val_losses"] == pytest.approx(one.summary_json["val_losses"], rel=1e-4)
        same_adapter(final[1], load_file(Path(again.summary_json["adapter"]) / "adapter_model.safetensors"))


def test_share_examples() -> None:
    import doctest

    from openforge.trainer import sft_ranks

    result = doctest.testmod(sft_ranks)
    assert result.attempted >= 2 and result.failed == 0
