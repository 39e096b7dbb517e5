"""`forge sft --from RUN [--from RUN2] --min-reward 1.0 --epochs N`: supervised fine-tuning on recorded
rollouts (docs/trainer.md, "SFT before RL")."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from openforge.forge_cli.context import state
from openforge.runs.sft import run_sft
from openforge.store import TrainStep


def sft_cmd(
    ctx: typer.Context,
    sources: Annotated[list[str], typer.Option("--from", help="a run whose rollouts are the data (repeatable; "
                                                "unique prefixes or 'latest')")],
    min_reward: Annotated[Optional[float], typer.Option("--min-reward", help="keep rollouts scored at least this "
                                                        "(rejection sampling; default: a forge collect run's own "
                                                        "--min-reward, else 1.0)")] = None,
    epochs: Annotated[int, typer.Option("--epochs", min=1, help="passes over the kept trajectories")] = 3,
    val_tasks: Annotated[int, typer.Option("--val-tasks", min=0, help="tasks held out for the validation "
                                           "loss")] = 1,
) -> None:
    """Fine-tune the student (engine.model, LoRA per [trainer]) on the assistant tokens of the kept
    rollouts of earlier runs; a run of kind sft whose adapter `forge up --init-from` can start RL from."""
    app = state(ctx)
    config = app.config()

    def show(step: TrainStep) -> None:
        typer.echo(f"step {step.step}  loss {step.loss:.4f}  tokens {step.n_tokens}")

    run_id, result = run_sft(app.store(), app.home, config, sources=sources, min_reward=min_reward, epochs=epochs,
                             val_tasks=val_tasks, on_step=show)
    val = f", validation loss {result.val_losses[0]:.4f} -> {result.val_losses[-1]:.4f}" if result.val_losses else ""
    typer.echo(f"run {run_id}: {result.steps} steps on {result.n_train} sequences, train loss "
               f"{result.train_losses[0]:.4f} -> {result.train_losses[-1]:.4f}{val}")
    typer.echo(f"adapter {result.adapter_path}")


def register(app: typer.Typer) -> None:
    app.command("sft")(sft_cmd)
