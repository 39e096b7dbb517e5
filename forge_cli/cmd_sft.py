"""`forge sft --from RUN [--from RUN2] --min-reward 1.0 --epochs N [--nproc N]`: supervised fine-tuning on
recorded rollouts (docs/trainer.md, "SFT before RL"); `forge sft --resume RUN` continues one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import typer

from openforge.errors import ConfigError
from openforge.forge_cli.context import rank_argv, state
from openforge.forge_cli.overrides import flag_overrides
from openforge.forge_cli.run_options import Nproc

if TYPE_CHECKING:
    from openforge.store import TrainStep


def sft_cmd(
    ctx: typer.Context,
    sources: Annotated[Optional[list[str]], typer.Option("--from", help="a run whose rollouts are the data "
                                                          "(repeatable; unique prefixes or 'latest')")] = None,
    min_reward: Annotated[Optional[float], typer.Option("--min-reward", help="keep rollouts scored at least this "
                                                        "(rejection sampling; default: a forge collect run's own "
                                                        "--min-reward, else 1.0)")] = None,
    epochs: Annotated[int, typer.Option("--epochs", min=1, help="passes over the kept trajectories")] = 3,
    val_tasks: Annotated[int, typer.Option("--val-tasks", min=0, help="whole tasks held out of training for a "
                                           "validation loss after each epoch (0: train on every task)")] = 0,
    demo: Annotated[bool, typer.Option("--demo", help="the demo's settings (openforge/presets/demo.toml): the "
                                       "tiny model at sft.lr 3e-3")] = False,
    nproc: Nproc = None,
    resume: Annotated[Optional[str], typer.Option("--resume", metavar="RUN", help="continue an sft run from its "
                                                  "last checkpoint, with its own sources and epochs")] = None,
) -> None:
    """Fine-tune the student (engine.model, LoRA per \\[trainer]) on the assistant tokens of the kept
    rollouts of earlier runs; a run of kind sft whose adapter `forge up --init-from` can start RL from."""
    from openforge.runs.sft import run_sft, sft_elsewhere  # torch: only when the command runs

    if (resume is None) == (not sources):
        raise ConfigError("give the data with --from RUN, or continue an sft run with --resume RUN (not both)")
    app = state(ctx)
    config = app.config(flag_overrides({"trainer.nproc": nproc}), preset="demo" if demo else None)
    code = sft_elsewhere(config.trainer.nproc, lambda n: rank_argv(ctx, nproc=n))
    if code is not None:
        raise typer.Exit(code)

    def show(step: TrainStep) -> None:
        typer.echo(f"step {step.step}  loss {step.loss:.4f}  tokens {step.n_tokens}")

    run_id, result = run_sft(app.store(), app.home, config, sources=sources or [], min_reward=min_reward,
                             epochs=epochs, val_tasks=val_tasks, on_step=show, resume=resume)
    val = (f", validation loss {result.val_losses[0]:.4f} -> {result.val_losses[-1]:.4f} on {result.n_val} "
           "held-out sequence(s)" if result.val_losses else ", no task held out")
    rate = f" at lr {config.sft.lr:g} (sft.lr)" if resume is None else ""  # a resume keeps its stored config
    typer.echo(f"run {run_id}: {result.steps} steps on {result.n_train} sequences{rate}, train loss "
               f"{result.train_losses[0]:.4f} -> {result.train_losses[-1]:.4f}{val}")
    typer.echo(f"adapter {result.adapter_path}")


def register(app: typer.Typer) -> None:
    app.command("sft")(sft_cmd)
