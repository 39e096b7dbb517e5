"""Commands of the train part: `forge train` (headless GRPO, one line per step) and `forge export`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console

from openforge.forge_cli.context import rank_argv, state
from openforge.forge_cli.run_options import DryRun, HarnessCheck, InitFrom, Nproc
from openforge.errors import ConfigError

if TYPE_CHECKING:
    from openforge.config import ForgeConfig
    from openforge.runs.control import RunController
    from openforge.runs.train import Outcome
    from openforge.store import Store

EXPORT_FORMATS = ("verl", "jsonl", "verl-sft", "verl-rl", "peft", "merged")


def register(app: typer.Typer) -> None:
    """Add this part's commands to the root app."""
    app.command("train")(train)
    app.command("export")(export)


def train(
    ctx: typer.Context,
    resume: Annotated[Optional[str], typer.Option("--resume", metavar="RUN",
                                                  help="continue a killed or stopped run after its last saved step")] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", min=1, help="total train steps (trainer.steps)")] = None,
    lr: Annotated[Optional[float], typer.Option("--lr", min=0.0, help="AdamW learning rate (trainer.lr)")] = None,
    tasks_per_step: Annotated[Optional[int], typer.Option("--tasks-per-step", min=1,
                                                          help="GRPO groups per step (trainer.tasks_per_step)")] = None,
    group_size: Annotated[Optional[int], typer.Option("--group-size", min=1,
                                                      help="rollouts per task, G (runner.samples_per_task)")] = None,
    full_finetune: Annotated[Optional[bool], typer.Option("--full-finetune/--lora",
                                                          help="train all weights instead of a LoRA adapter")] = None,
    overlap: Annotated[Optional[bool], typer.Option("--overlap/--no-overlap",
                                                    help="sample step N+1 while step N trains, one step "
                                                         "off-policy (= trainer.max_staleness 1)")] = None,
    name: Annotated[Optional[str], typer.Option("--name", help="a human name for the run")] = None,
    nproc: Nproc = None,
    init_from: InitFrom = None,
    dry_run: DryRun = False,
    harness_check: HarnessCheck = None,
) -> None:
    """Train the policy with GRPO on the configured tasks: engine, proxy, sandboxed rollouts, trainer.

    Headless (a line per step); `forge up` runs the same with the dashboard. Stop with Ctrl-C or
    `forge stop RUN`, continue with `forge train --resume RUN`: no step is lost or repeated."""
    from openforge.forge_cli import up_views
    from openforge.forge_cli.overrides import flag_overrides
    from openforge.runs.session import SessionRequest, run_session

    st = state(ctx)
    # Refused before anything is looked up: a bad flag is the error to report, not the run.
    if resume is not None and any(v is not None for v in (lr, tasks_per_step, full_finetune, overlap, group_size, name,
                                                  init_from)):
        raise ConfigError("--resume continues a run with its stored config; only --steps may change")
    config = st.config(flag_overrides({
        "trainer.steps": steps, "trainer.lr": lr, "trainer.tasks_per_step": tasks_per_step,
        "trainer.full_finetune": full_finetune, "trainer.overlap": overlap, "runner.samples_per_task": group_size,
        "name": name, "trainer.nproc": nproc, "trainer.init_from": init_from}))
    console = Console()
    if dry_run:
        from openforge.forge_cli.plan_view import dry_run as print_plan

        print_plan(config, home=st.home, resume=resume, console=console,
                   harness_check=harness_check is not False)
        return

    def front_end(store: Store, run_id: str, config: ForgeConfig, controller: RunController, resumed: bool) -> Outcome:
        return up_views.run_headless(store, run_id, config, controller, home=st.home, resume=resumed, console=console)

    code = run_session(SessionRequest(command="train", config=config, resume=resume, steps=steps, nproc=nproc),
                       home=st.home, open_store=st.store, rank_argv=lambda n: rank_argv(ctx, nproc=n),
                       front_end=front_end, say=console.print)
    if code:
        raise typer.Exit(code)


def export(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="run id, unique prefix, or 'latest'")],
    out: Annotated[str, typer.Option("--out", "-o", help="the file to write (.parquet for verl, .jsonl for jsonl); "
                                     "for peft and merged a new or empty folder")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="verl (parquet, veRL's columns), jsonl, verl-sft "
                                     "(messages+tools for veRL's MultiTurnSFTDataset), verl-rl (one prompt a task "
                                     "for RLHFDataset, graded by integrations/verl/reward.py); or the trained model: "
                                     "peft (the LoRA adapter folder) or merged (full safetensors weights with the "
                                     "tokenizer and chat template)")] = "jsonl",
    step: Annotated[Optional[int], typer.Option("--step", min=0, help="peft/merged: the checkpoint of this train "
                                                "step (default: the newest)")] = None,
    min_reward: Annotated[Optional[float], typer.Option("--min-reward", help="verl-sft: keep rollouts with at least "
                                                        "this reward (default: those that passed their task)")] = None,
) -> None:
    """Write a run's recorded trajectories (token ids, masks, engine logprobs, rewards) for other RL codebases,
    or its trained model (--format peft|merged) for transformers, SGLang and vLLM."""
    from openforge.trainer.export import export_jsonl, export_verl

    if fmt not in EXPORT_FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(EXPORT_FORMATS)}, not {fmt!r}")
    if step is not None and fmt not in ("peft", "merged"):
        raise ConfigError("--step picks a checkpoint: it goes with --format peft or merged")
    store = state(ctx).store()
    if fmt in ("peft", "merged"):
        from openforge.runs.model_export import export_model

        done = export_model(store, state(ctx).home, run_id, fmt=fmt, out=out, step=step)
        what = ("adapter" if fmt == "peft" else "full fine-tune" if done.kind == "full"
                else "model merged with the adapter")
        typer.echo(f"wrote the {what} of step {done.step} of {done.run_id} to {done.out} ({fmt})")
        return
    run = store.get_run(run_id)
    if fmt in ("verl-sft", "verl-rl"):
        from openforge.integrations.verl.data import rl_rows, sft_rows, write_rows

        rows = sft_rows(store, run.id, min_reward=min_reward) if fmt == "verl-sft" else rl_rows(store, run.id)
        n = write_rows(rows, out)
        what = "conversation(s) of passing rollouts" if fmt == "verl-sft" else "task prompt(s)"
        typer.echo(f"wrote {n} {what} of {run.id} to {out} ({fmt})")
        from openforge.integrations import verl as verl_bridge

        here = Path(verl_bridge.__file__).parent
        typer.echo(f"veRL: data.custom_cls.path={here / 'sft.py'} data.custom_cls.name=ForgeSFTDataset"
                   if fmt == "verl-sft" else f"veRL: reward.custom_reward_function.path={here / 'reward.py'} "
                   "reward.custom_reward_function.name=compute_score")
        return
    n = (export_verl if fmt == "verl" else export_jsonl)(store, run.id, out)
    if n == 0:
        typer.echo(f"warning: run {run.id} has no scored trajectories; wrote an empty {fmt} file", err=True)
    typer.echo(f"wrote {n} trajectory segment(s) of {run.id} to {out} ({fmt})")
