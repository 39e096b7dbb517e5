"""`forge up` (engine + proxy + rollouts + trainer for one run, with the dashboard) and `forge dash RUN`."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from openforge.forge_cli import up_views
from openforge.forge_cli.cmd_train import _stored_nproc
from openforge.forge_cli.context import is_tty, state
from openforge.forge_cli.overrides import cli_overrides
from openforge.config import load_config
from openforge.errors import ForgeError
from openforge.paths import runs_dir
from openforge.runs.control import RunController
from openforge.runs.prepare import mark_dead_runs, preflight, prepare_run


def register(app: typer.Typer) -> None:
    """Add this part's commands to the root app."""
    app.command("up")(up)
    app.command("dash")(dash)


def up(
    ctx: typer.Context,
    demo: Annotated[bool, typer.Option("--demo", help="the tiny model on the built-in tasks: a few minutes on a laptop")] = False,
    headless: Annotated[bool, typer.Option("--headless", help="no dashboard: progress bars and a line per step (CI, clusters)")] = False,
    steps: Annotated[Optional[int], typer.Option("--steps", min=1, help="train steps (overrides trainer.steps)")] = None,
    resume: Annotated[Optional[str], typer.Option("--resume", metavar="RUN", help="continue an interrupted or stopped run")] = None,
    name: Annotated[Optional[str], typer.Option("--name", help="a human name for the run")] = None,
    harness: Annotated[Optional[str], typer.Option("--harness", help="the harness rollouts run in (harness.name); "
                                                   "with --demo, claude-code and codex get settings sized for a laptop")] = None,
    stay: Annotated[bool, typer.Option("--stay", help="keep the dashboard open when the run ends (--demo closes it)")] = False,
    nproc: Annotated[Optional[int], typer.Option("--nproc", min=1, help="trainer processes under torchrun, "
                                                 "sharded with FSDP2; one GPU each on GPUs (trainer.nproc)")] = None,
) -> None:
    """Bring up the engine, the proxy, sandboxed rollouts and the GRPO trainer for one run, and show it live."""
    from openforge.trainer import launch

    if launch.is_follower():  # a torchrun rank other than 0: rank 0 owns the run and drives this one
        launch.follow()
        return
    st = state(ctx)
    console = Console()
    home = st.home
    overrides = cli_overrides(demo=demo, sets=st.sets, steps=steps, name=name, harness=harness)
    if nproc is not None:
        overrides.setdefault("trainer", {})["nproc"] = nproc
    config = load_config(st.config_path, overrides=overrides)
    procs = nproc or _stored_nproc(st, resume) or config.trainer.nproc
    if procs > 1 and not launch.under_torchrun():  # the same command on `procs` ranks; rank 0 is the run
        code = launch.relaunch(procs, _argv(st, demo=demo, headless=headless, steps=steps, resume=resume, name=name,
                                            harness=harness, stay=stay, nproc=procs))
        if code:
            raise typer.Exit(code)
        return
    store = st.store()
    for run_id in mark_dead_runs(store):
        console.print(f"[magenta]{run_id}[/] was left running by a process that is gone: marked interrupted "
                      f"(continue it with `forge up --resume {run_id}`)")
    if resume is None:
        preflight(config, home)
    run_id, config = prepare_run(store, config, home=home, resume=resume, steps=steps)
    if resume is not None:
        preflight(config, home)
    controller = RunController(store, run_id)
    console.print(f"{'resuming' if resume else 'run'} [bold]{run_id}[/]: {config.trainer.steps} step(s) of "
                  f"{config.harness.name} on {config.tasks.path} in {config.sandbox.type} sandboxes, "
                  f"engine {config.engine.kind}; log {runs_dir(home) / run_id / 'forge.log'}")
    if headless or not is_tty():
        outcome = up_views.run_headless(store, run_id, config, controller, home=home,
                                        resume=resume is not None, console=console)
    else:
        outcome = up_views.run_tui(store, run_id, config, controller, home=home, resume=resume is not None,
                                   exit_after_done_s=None if stay or not demo else 5.0, console=console)
    console.print(up_views.summary(store, run_id, home))
    if outcome.status == "failed":
        raise ForgeError(f"run {run_id} failed: {outcome.error}")


def _argv(st: Any, **opts: Any) -> list[str]:
    """This `forge up` invocation again, for each torchrun rank (flags given only when set)."""
    out = ["--home", str(st.home), *(["--config", st.config_path] if st.config_path else [])]
    for s in st.sets:
        out += ["--set", s]
    out.append("up")
    for key, value in opts.items():
        if value is None or value is False:
            continue
        out += [f"--{key}"] if value is True else [f"--{key}", str(value)]
    return out


def dash(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="run id, unique prefix, or 'latest'")] = "latest",
) -> None:
    """Open the dashboard of a running or finished run, read-only, from any terminal."""
    from openforge.forge_cli.dashboard import make_dashboard

    st = state(ctx)
    if not is_tty():
        raise ForgeError("forge dash needs a terminal; use `forge show RUN` to print a run's summary")
    make_dashboard(st.store().path, run_id).run()
