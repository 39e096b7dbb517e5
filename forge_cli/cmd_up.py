"""`forge up` (engine + proxy + rollouts + trainer for one run, with the dashboard) and `forge dash RUN`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console

from openforge.forge_cli import up_views
from openforge.forge_cli.context import is_tty, rank_argv, state
from openforge.forge_cli.overrides import flag_overrides
from openforge.forge_cli.run_options import DryRun, HarnessCheck, InitFrom, Nproc
from openforge.errors import ForgeError

if TYPE_CHECKING:
    from openforge.config import ForgeConfig
    from openforge.runs.control import RunController
    from openforge.runs.train import Outcome
    from openforge.store import Store

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
    nproc: Nproc = None,
    init_from: InitFrom = None,
    dry_run: DryRun = False,
    harness_check: HarnessCheck = None,
) -> None:
    """Bring up the engine, the proxy, sandboxed rollouts and the GRPO trainer for one run, and show it live."""
    from openforge.runs.session import SessionRequest, run_session

    st = state(ctx)
    console = Console()
    if resume is not None and init_from is not None:
        raise ForgeError("--resume continues a run from its own checkpoints; --init-from starts a new one")
    flags = flag_overrides({"harness.name": harness, "trainer.steps": steps, "name": name, "trainer.nproc": nproc,
                            "trainer.init_from": init_from})
    # --demo's settings are a preset, picked by the harness however it was named (--harness or --set)
    config = st.config(flags, preset="demo" if demo else None)
    if dry_run:
        from openforge.forge_cli.plan_view import dry_run as print_plan

        print_plan(config, home=st.home, resume=resume, console=console,
                   harness_check=harness_check is not False)
        return
    tui = not headless and is_tty()

    def front_end(store: Store, run_id: str, config: ForgeConfig, controller: RunController, resumed: bool) -> Outcome:
        if not tui:
            return up_views.run_headless(store, run_id, config, controller, home=st.home, resume=resumed,
                                         console=console)
        return up_views.run_tui(store, run_id, config, controller, home=st.home, resume=resumed,
                                exit_after_done_s=None if stay or not demo else 5.0, console=console)

    code = run_session(SessionRequest(command="up", config=config, resume=resume, steps=steps, nproc=nproc),
                       home=st.home, open_store=st.store, rank_argv=lambda n: rank_argv(ctx, nproc=n),
                       front_end=front_end, say=console.print)
    if code:
        raise typer.Exit(code)


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
