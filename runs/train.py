"""One training run's lifecycle: bring up the stack, `train()`, tear it all down, record the outcome.

    run_id, config = prepare_run(store, config, home=home)          # runs.prepare: the run row, its tasks
    controller = RunController(store, run_id)                       # what the dashboard's p / q drive
    thread = start_run_thread(store, run_id, config, controller, home=home)
    ...                                                             # the dashboard, or headless printing
    outcome = wait_for(thread, controller)

The lifecycle runs in one worker thread, because the trainer is plain synchronous PyTorch and the
front end (Textual, or Rich progress) owns the main thread, where signals arrive.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openforge import reserve
from openforge.config import ForgeConfig, stored_config
from openforge.errors import EngineError, ForgeError
from openforge.paths import runs_dir
from openforge.store import Store
from openforge.runs.control import RunController
from openforge.runs.prepare import load_run_tasks
from openforge.runs.stack import Stack

log = logging.getLogger("forge.run")


@dataclass
class Outcome:
    """How the run ended, for the front end to print: finished, stopped, or failed with why."""

    status: str = "created"
    error: str | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)


def fmt_num(value: Any, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def run_training(store: Store, run_id: str, config: ForgeConfig, controller: RunController, *, home: Path,
                 resume: bool = False, on_step: Callable[[dict[str, Any]], None] | None = None) -> Outcome:
    """Stack up, train(), stack down. Never raises: returns the outcome (also recorded in the store)."""
    from openforge.trainer.loop import train
    from openforge.trainer.adapter_sync import AdapterSync
    from openforge.trainer.samplers import RolloutSampler
    from openforge.runs.tracking import open_tracker

    outcome = Outcome()
    tracker = open_tracker(store, run_id, config, home=home)  # W&B / TensorBoard, when [tracking] names them
    stack = Stack(config, store, log_dir=runs_dir(home) / run_id, runner=True, client=True)
    controller.on_stop.append(stack.abort)  # don't wait out the engine's startup

    def step_done(metrics: dict[str, Any], rollouts: list[Any]) -> None:
        log.info("step %d done: reward %s, loss %s, adapter %s loaded", metrics.get("step"),
                 fmt_num(metrics.get("reward_mean")), fmt_num(metrics.get("loss")), store.get_run(run_id).current_adapter)
        outcome.steps.append(metrics)
        tracker.log_step(metrics, rollouts)
        if on_step is not None:
            on_step(metrics)
        if int(metrics["step"]) + 1 < config.trainer.steps:  # a stop during the last step: it is done anyway
            controller.check()

    def before_step(step: int) -> None:
        controller.before_step(step)
        if (failure := stack.engine_failure) is not None:  # the supervisor gave up restarting it
            raise EngineError(failure)

    reserve.hold(store.path)  # room to record how the run ended, should the disk fill up
    try:
        stack.start()
        controller.check()
        assert stack.bridge is not None
        controller.attach(stack.runner, stack.bridge)
        stack.engine.on_restart.append(lambda: _reload_adapter(store, run_id, stack))
        sampler = RolloutSampler(stack.runner, stack.bridge, group_size=config.runner.samples_per_task,
                                 cancel=controller.cancel, before_step=before_step,
                                 harnesses=config.harness.weights())
        result = train(store, run_id, config.trainer, model_path=config.engine.model, tasks=load_run_tasks(config),
                       sampler=sampler, engine=AdapterSync(stack.client, stack.bridge), home=home, resume=resume,
                       on_step=step_done)
        outcome.status = "finished"
        log.info("finished %d step(s); the engine serves %s", len(result.steps), result.adapter or "the base model")
    except BaseException as exc:  # noqa: BLE001 - reported as the run's outcome, never a traceback on a TUI
        _classify(exc, outcome, stopping=controller.stopping)
    finally:
        stack.stop()
        tracker.close(failed=outcome.status == "failed")
        _record_end(store, run_id, outcome)
    return outcome


def _classify(exc: BaseException, outcome: Outcome, *, stopping: bool) -> None:
    if isinstance(exc, KeyboardInterrupt) or stopping:
        outcome.status = "stopped"  # whatever broke while stopping was the stop itself
    elif isinstance(exc, ForgeError):
        outcome.status, outcome.error = "failed", str(exc)
        log.error("%s", exc)
    else:
        outcome.status, outcome.error = "failed", f"{type(exc).__name__}: {exc}"
        log.exception("the run failed")


def _record_end(store: Store, run_id: str, outcome: Outcome) -> None:
    """The outcome into the store, on a full disk too (the store's reserve), never raising: a run whose
    end cannot be written says so in its outcome, and the next start marks it interrupted."""
    try:
        reserve.write_despite_full_disk(store.path, lambda: _record_outcome(store, run_id, outcome))
    except ForgeError as exc:
        log.error("could not record the run's end: %s", exc)
        outcome.error = f"{outcome.error}; " if outcome.error else ""
        outcome.error += f"could not record the run's end: {exc}"
        if outcome.status == "finished":
            outcome.status = "failed"
    else:
        reserve.release(store.path)


def _record_outcome(store: Store, run_id: str, outcome: Outcome) -> None:
    if outcome.status == "stopped":
        store.set_run_status(run_id, "stopped")
        store.update_run(run_id, error=None)
    elif outcome.status == "failed":
        store.set_run_status(run_id, "failed", error=outcome.error)  # the reason, as the front end prints it
    store.interrupt_unfinished(run_id)  # nothing of this run is in flight any more


def _reload_adapter(store: Store, run_id: str, stack: Stack) -> None:
    """A restarted engine has no adapters: load the one the run's rollouts are served with again."""
    from openforge.trainer.checkpoint import init_adapter_name

    ckpt = store.latest_checkpoint(run_id)
    init = stored_config(store.get_run(run_id).config_json or {}).trainer.init_from
    name, path = (ckpt.adapter_name, ckpt.path) if ckpt is not None else (init_adapter_name(run_id), init)
    if name and path and stack.bridge is not None:  # before step 0: the adapter the run started from
        stack.bridge.run(stack.client.load_lora_adapter(name, path))
        log.info("engine restarted: adapter %s loaded again", name)


# ---------------------------------------------------------------------------------------------
# The worker thread, and waiting for it from the front end.


def run_log_handler(home: Path, run_id: str) -> logging.Handler:
    """The run's log file, `<home>/runs/<id>/forge.log` (the dashboard tails it)."""
    path = runs_dir(home) / run_id / "forge.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname).1s %(name)s: %(message)s", "%H:%M:%S"))
    handler.setLevel(logging.INFO)
    return handler


class RunThread(threading.Thread):
    """The lifecycle in a thread; `.outcome` once it has ended."""

    def __init__(self, target: Callable[[], Outcome]) -> None:
        super().__init__(name="forge-run", daemon=True)
        self._target_fn = target
        self.outcome: Outcome | None = None
        # Waited on instead of join(): a KeyboardInterrupt inside Thread.join() can leave the thread
        # looking finished to is_alive() (CPython 3.11) while it is still tearing down.
        self.done = threading.Event()

    def run(self) -> None:
        try:
            self.outcome = self._target_fn()
        finally:
            self.done.set()


def start_run_thread(store: Store, run_id: str, config: ForgeConfig, controller: RunController, *, home: Path,
                     resume: bool = False, on_step: Callable[[dict[str, Any]], None] | None = None) -> RunThread:
    handler = run_log_handler(home, run_id)
    root = logging.getLogger()
    root.addHandler(handler)
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
    # One line per HTTP request to the engine would drown the run's own log.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    def target() -> Outcome:
        try:
            return run_training(store, run_id, config, controller, home=home, resume=resume, on_step=on_step)
        finally:
            root.removeHandler(handler)
            handler.close()

    thread = RunThread(target)
    thread.start()
    return thread


def wait_for(thread: RunThread, controller: RunController, *, grace_s: float = 60.0,
             on_tick: Callable[[], None] | None = None) -> Outcome:
    """Join the lifecycle thread. Ctrl-C here stops the run; a second one while it tears down is
    ignored: it is stopping sandboxes and children, and leaving now would orphan them."""
    deadline = None
    while not thread.done.is_set():
        try:
            thread.done.wait(0.5)
            if on_tick is not None:
                on_tick()
        except KeyboardInterrupt:
            controller.stop()
        if controller.stopping:
            deadline = deadline or time.monotonic() + grace_s
            if time.monotonic() > deadline:
                log.error("teardown did not finish within %.0fs", grace_s)
                return Outcome(status="stopped", error=f"teardown did not finish within {grace_s:.0f}s")
    return thread.outcome or Outcome(status="failed", error="the run thread ended without an outcome")
