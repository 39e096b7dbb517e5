"""The two front ends of `forge up` / `forge train`: the dashboard, or headless Rich progress
(the closing summary is runs/session.py's).

Both own the main thread, where SIGTERM (`forge stop RUN`) arrives, while the run's lifecycle runs in
the worker thread that `openforge.runs.train.start_run_thread` starts.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from openforge.config import ForgeConfig
from openforge.store import Store
from openforge.runs.control import RunController
from openforge.runs.train import Outcome, fmt_num, start_run_thread, wait_for


class _OnSigterm:
    """SIGTERM -> `action()` while inside the block (only the main thread may install handlers)."""

    def __init__(self, action: Callable[[], None]) -> None:
        self.action, self.previous = action, None

    def __enter__(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, lambda *_: self.action())

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)


def run_headless(store: Store, run_id: str, config: ForgeConfig, controller: RunController, *, home: Path,
                 resume: bool, console: Console) -> Outcome:
    """Rich progress bars (steps; rollouts of the current step) and one line per finished step."""
    done = len(store.list_train_steps(run_id))
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        steps_bar = progress.add_task("train steps", total=config.trainer.steps, completed=done)
        per_step = config.trainer.tasks_per_step * config.runner.samples_per_task
        roll_bar = progress.add_task("rollouts", total=per_step)

        def on_step(m: dict[str, Any]) -> None:
            progress.console.print(step_line(m, config.trainer.steps, store.get_run(run_id).current_adapter, run_id))
            progress.update(steps_bar, completed=int(m["step"]) + 1)

        def tick() -> None:
            newest = store.list_rollouts(run_id, newest_first=True, limit=1)
            if not newest:
                return
            step = newest[0].step
            finished = sum(1 for r in store.list_rollouts(run_id, step=step) if r.status not in ("pending", "running"))
            progress.update(roll_bar, description=f"rollouts of step {step}", completed=min(finished, per_step))

        thread = start_run_thread(store, run_id, config, controller, home=home, resume=resume, on_step=on_step)
        with _OnSigterm(controller.stop):
            return wait_for(thread, controller, on_tick=tick)


def step_line(m: dict[str, Any], total: int, adapter: str | None, run_id: str) -> str:
    # The step as the store, `forge show` and the adapters number it (from 0), then how far the run is.
    return (f"step {int(m['step'])} ({int(m['step']) + 1} of {total})  reward {fmt_num(m.get('reward_mean'), 3)}  "
            f"pass {fmt_num(m.get('pass_rate'), 3)}  loss {fmt_num(m.get('loss'), 3)}  kl {fmt_num(m.get('kl'), 3)}  "
            f"mismatch {fmt_num(m.get('mismatch_max'), 2)}  tok/s {fmt_num(m.get('tokens_per_s'), 3)}  "
            f"adapter {short_adapter(adapter, run_id)}")


def short_adapter(adapter: str | None, run_id: str) -> str:
    """`run-20261202-1c10ca-step-3` -> `step-3`: the run id is on screen already."""
    return "base" if adapter is None else adapter.removeprefix(f"{run_id}-")


def run_tui(store: Store, run_id: str, config: ForgeConfig, controller: RunController, *, home: Path,
            resume: bool, exit_after_done_s: float | None, console: Console | None = None,
            headless_app: bool = False) -> Outcome:
    """The dashboard in the foreground; `q`/Ctrl-C/SIGTERM stop the run, then the worker tears down.
    (`headless_app` runs the same app without a terminal: tests.)"""
    from openforge.forge_cli.dashboard import make_dashboard

    app = make_dashboard(store.path, run_id, controller=controller, exit_after_done_s=exit_after_done_s)
    thread = start_run_thread(store, run_id, config, controller, home=home, resume=resume)

    def on_term() -> None:
        controller.stop()
        app.exit()

    with _OnSigterm(on_term):
        app.run(headless=headless_app)
    if not thread.done.is_set():
        controller.stop()  # the dashboard closed before the run ended
        (console or Console()).print(f"stopping {run_id}: rollouts and their sandboxes, the proxy, the engine ...")
    return wait_for(thread, controller)

