"""Commands of the train part: `forge train` (headless GRPO, one line per step) and `forge export`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from openforge.forge_cli.context import state
from openforge.errors import ConfigError, ForgeError

EXPORT_FORMATS = ("verl", "jsonl", "verl-sft", "verl-rl")


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
                                                    help="sample step N+1 while step N trains (one step off-policy)")] = None,
    name: Annotated[Optional[str], typer.Option("--name", help="a human name for the run")] = None,
    nproc: Annotated[Optional[int], typer.Option("--nproc", min=1, help="trainer processes under torchrun, "
                                                 "sharded with FSDP2; one GPU each on GPUs (trainer.nproc)")] = None,
) -> None:
    """Train the policy with GRPO on the configured tasks: engine, proxy, sandboxed rollouts, trainer.

    Headless (a line per step); `forge up` runs the same with the dashboard. Stop with Ctrl-C or
    `forge stop RUN`, continue with `forge train --resume RUN`: no step is lost or repeated."""
    from openforge.trainer import launch

    if launch.is_follower():  # a torchrun rank other than 0: rank 0 owns the run and drives this one
        launch.follow()
        return
    from openforge.forge_cli import up_views
    from openforge.forge_cli.overrides import cli_overrides
    from openforge.config import load_config
    from openforge.runs.control import RunController
    from openforge.runs.prepare import mark_dead_runs, preflight, prepare_run

    st = state(ctx)
    # Refused before anything is looked up: a bad flag is the error to report, not the run.
    trainer: dict[str, Any] = {k: v for k, v in (("lr", lr), ("tasks_per_step", tasks_per_step),
                                                 ("full_finetune", full_finetune), ("overlap", overlap)) if v is not None}
    if resume is not None and (trainer or group_size is not None or name is not None):
        raise ConfigError("--resume continues a run with its stored config; only --steps may change")
    procs = nproc or _stored_nproc(st, resume) or load_config(st.config_path, sets=st.sets).trainer.nproc
    if procs > 1 and not launch.under_torchrun():
        argv = _argv(st, resume=resume, steps=steps, lr=lr, tasks_per_step=tasks_per_step, group_size=group_size,
                     full_finetune=full_finetune, overlap=overlap, name=name, nproc=procs)
        code = launch.relaunch(procs, argv)
        if code:
            raise typer.Exit(code)
        return
    overrides = cli_overrides(demo=False, sets=st.sets, steps=steps, name=name)
    if trainer:
        overrides.setdefault("trainer", {}).update(trainer)
    if group_size is not None:
        overrides.setdefault("runner", {})["samples_per_task"] = group_size
    if nproc is not None:
        overrides.setdefault("trainer", {})["nproc"] = nproc
    config = load_config(st.config_path, overrides=overrides)
    store = st.store()
    console = Console()
    mark_dead_runs(store)
    preflight(config, st.home)
    run_id, config = prepare_run(store, config, home=st.home, resume=resume, steps=steps)
    t = config.trainer
    console.print(f"{'resuming' if resume else 'training'} [bold]{run_id}[/]: {t.steps} step(s) x {t.tasks_per_step} "
                  f"task(s) x {config.runner.samples_per_task} rollouts, {'full' if t.full_finetune else f'LoRA r={t.lora_r}'}, "
                  f"lr {t.lr:g}, {config.harness.name} in {config.sandbox.type} sandboxes")
    outcome = up_views.run_headless(store, run_id, config, RunController(store, run_id), home=st.home,
                                    resume=resume is not None, console=console)
    console.print(up_views.summary(store, run_id, st.home))
    if outcome.status == "failed":
        raise ForgeError(f"run {run_id} failed: {outcome.error}")


def _stored_nproc(st: Any, resume: Optional[str]) -> int | None:
    """A resumed run's trainer.nproc, from its stored config."""
    if resume is None:
        return None
    stored = st.store().get_run(resume).config_json or {}
    return int(stored.get("trainer", {}).get("nproc", 1))


def _argv(st: Any, **opts: Any) -> list[str]:
    """This `forge train` invocation again, for each torchrun rank."""
    out = [*(["--home", str(st.home)]), *(["--config", st.config_path] if st.config_path else [])]
    for s in st.sets:
        out += ["--set", s]
    out.append("train")
    flags = {"full_finetune": ("--full-finetune", "--lora"), "overlap": ("--overlap", "--no-overlap")}
    for key, value in opts.items():
        if value is None:
            continue
        if key in flags:
            out.append(flags[key][0] if value else flags[key][1])
        else:
            out += [f"--{key.replace('_', '-')}", str(value)]
    return out


def export(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="run id, unique prefix, or 'latest'")],
    out: Annotated[str, typer.Option("--out", "-o", help="the file to write (.parquet for verl, .jsonl for jsonl)")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="verl (parquet, veRL's columns), jsonl, verl-sft "
                                     "(messages+tools for veRL's MultiTurnSFTDataset) or verl-rl (one prompt a task "
                                     "for RLHFDataset, graded by integrations/verl/reward.py)")] = "jsonl",
    min_reward: Annotated[Optional[float], typer.Option("--min-reward", help="verl-sft: keep rollouts with at least "
                                                        "this reward (default: those that passed their task)")] = None,
) -> None:
    """Write a run's recorded trajectories (token ids, masks, engine logprobs, rewards) for other RL codebases."""
    from openforge.trainer.export import export_jsonl, export_verl

    if fmt not in EXPORT_FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(EXPORT_FORMATS)}, not {fmt!r}")
    store = state(ctx).store()
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
