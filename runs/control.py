"""Pause, resume and stop for one run, callable from any thread (the dashboard, a signal handler).

The controller holds the run's `CancelToken`: `stop()` cancels the step being sampled (the runner's
own cleanup stops its sandboxes before the trainer hears of it) and makes every later step refuse to
start. Pause is the runner's gate: rollouts in flight finish, no new one starts.

`stop_run` is the other end, from another process (`forge stop RUN`): it signals the run's owner,
whose controller then stops the run.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from openforge.errors import ForgeError
from openforge.store import Store
from openforge.trainer.bridge import BackgroundLoop
from openforge.trainer.cancel import Cancelled, CancelToken

log = logging.getLogger("forge.run")

# What the trainer and the front ends see when a run is stopped: a KeyboardInterrupt, recorded as `stopped`.
Stopped = Cancelled


class RunController:
    """Pause/resume/stop for run `run_id`. `attach(runner, bridge)` once the runner exists."""

    def __init__(self, store: Store, run_id: str) -> None:
        self.store, self.run_id = store, run_id
        self.cancel = CancelToken()
        self.runner: Any = None
        self.bridge: BackgroundLoop | None = None  # the loop the runner's coroutines run on
        self._paused = False
        self.on_stop: list[Callable[[], Any]] = []  # run in a thread of their own: stop() returns at once

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def stopping(self) -> bool:
        return self.cancel.cancelled

    def attach(self, runner: Any, bridge: BackgroundLoop) -> None:
        """The runner now exists: a pause pressed while the engine was loading applies to it."""
        self.runner, self.bridge = runner, bridge
        if self._paused:
            self._runner_call("pause")

    def _runner_call(self, name: str) -> None:
        # The runner's gate is an asyncio.Event of the bridge's loop: set/clear it on that loop.
        if self.runner is not None and self.bridge is not None:
            self.bridge.loop.call_soon_threadsafe(getattr(self.runner, name))

    def pause(self) -> None:
        self._paused = True
        self._runner_call("pause")
        self.store.update_run(self.run_id, status="paused")
        log.info("rollouts paused: the ones in flight finish, no new ones start")

    def resume(self) -> None:
        self._paused = False
        self._runner_call("resume")
        self.store.update_run(self.run_id, status="running")
        log.info("rollouts resumed")

    def stop(self) -> None:
        if self.cancel.cancelled:
            return
        log.info("stopping: cancelling rollouts, then the proxy and the engine")
        self.cancel.cancel()
        if self._paused:
            self._runner_call("resume")  # a paused runner must wake up to see its cancellation
        for hook in self.on_stop:
            threading.Thread(target=hook, name="forge-stop-hook", daemon=True).start()

    def check(self) -> None:
        """Raise `Stopped` once `stop()` was called."""
        self.cancel.check()

    def before_step(self, step: int) -> None:
        """The trainer marks the run `running` as it starts; a run paused before that is not."""
        self.check()
        if self._paused:
            self.store.update_run(self.run_id, status="paused")


@dataclass(frozen=True)
class StopRequested:
    """What `stop_run` did: SIGTERM to the owner `pid`, or (pid None) marked a run with no live owner stopped."""

    run_id: str
    pid: int | None


def stop_run(store: Store, run_id: str) -> StopRequested:
    """Ask run `run_id` (id, unique prefix or 'latest') to stop. Its owner process gets SIGTERM and stops
    its rollouts, their sandboxes, the proxy and the engine itself; a run whose owner is gone has nobody to
    do that: it is marked stopped here and its unfinished rollouts interrupted. ForgeError if it is not running."""
    run = store.get_run(run_id)
    if run.status not in ("running", "paused", "created"):
        raise ForgeError(f"run {run.id} is {run.status}, not running")
    if run.owner_pid:
        try:
            os.kill(run.owner_pid, signal.SIGTERM)
            return StopRequested(run.id, run.owner_pid)
        except ProcessLookupError:
            pass
    store.set_run_status(run.id, "stopped")
    store.interrupt_unfinished(run.id)
    return StopRequested(run.id, None)
