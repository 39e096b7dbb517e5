"""`forge up` (engine + proxy + rollouts + trainer for one run, with the dashboard) and `forge dash RUN`."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.console import Console

from forge_cli import up_views
from forge_cli.context import is_tty, state
from forge_cli.overrides import cli_overrides
from openforge.config import load_config
from openforge.errors import ForgeError
from openforge.paths import runs_dir
from runs.control import RunController
from runs.prepare import mark_dead_runs, preflight, prepare_run


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
) -> None:
    """Bring up the engine, the proxy, sandboxed rollouts and the GRPO trainer for one run, and show it live."""
    st = state(ctx)
    console = Console()
    home = st.home
    overrides = cli_overrides(demo=demo, sets=st.sets, steps=steps, name=name, harness=harness)
    config = load_config(st.config_path, overrides=overrides)
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


def dash(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="run id, unique prefix, or 'latest'")] = "latest",
) -> None:
    """Open the dashboard of a running or finished run, read-only, from any terminal."""
    from forge_cli.dashboard import make_dashboard

    st = state(ctx)
    if not is_tty():
        raise ForgeError("forge dash needs a terminal; use `forge show RUN` to print a run's summary")
    make_dashboard(st.store().path, run_id).run()
