"""`forge up`: bring up the engine, the proxy, the rollout runner and the trainer for one run, and take
every one of them down again, whatever ends the run (its last step, `q`, Ctrl-C, SIGTERM, an error).

    run_id, config = prepare_run(store, config, home=home)          # up_setup: the run row, its tasks
    controller = RunController(store, run_id)                       # what the dashboard's p / q drive
    thread = start_run_thread(store, run_id, config, controller, home=home)
    ...                                                             # the dashboard, or headless printing
    controller.stop(); thread.join()

The whole lifecycle runs in one worker thread (`run_lifecycle`), because the trainer is plain
synchronous PyTorch and the front end (Textual, or Rich progress) owns the main thread, where signals
arrive. The order is fixed: engine and proxy (side by side) -> runner -> train(); teardown is the
reverse, in a `finally`, so a failure at any stage still stops what was started before it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forge_cli.snapshot import run_log_path
from forge_cli.up_setup import load_run_tasks
from openforge.config import ForgeConfig
from openforge.errors import EngineError, ForgeError
from openforge.store import Store

log = logging.getLogger("forge.up")

# ---------------------------------------------------------------------------------------------
# Control from the front end: pause, resume, stop.


class Stopped(KeyboardInterrupt):
    """Raised inside the trainer to end the run; the trainer records a KeyboardInterrupt as `stopped`."""


class RunController:
    """Pause/resume/stop for one run, callable from any thread (the dashboard, a signal handler)."""

    def __init__(self, store: Store, run_id: str) -> None:
        self.store, self.run_id = store, run_id
        self.stopping = threading.Event()
        self.runner: Any = None  # set once the runner exists
        self.bridge: Any = None  # the BackgroundLoop the runner's coroutines run on
        self._paused = False
        self._current: Any = None  # the asyncio task sampling the current step
        self.on_stop: list[Callable[[], Any]] = []  # run in a thread of their own: stop() returns at once

    @property
    def paused(self) -> bool:
        return self._paused

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
        if self.stopping.is_set():
            return
        self.stopping.set()
        log.info("stopping: cancelling rollouts, then the proxy and the engine")
        task, bridge = self._current, self.bridge
        if task is not None and bridge is not None:
            bridge.loop.call_soon_threadsafe(task.cancel)
        if self._paused:
            self._runner_call("resume")  # a paused runner must wake up to see its cancellation
        for hook in self.on_stop:
            threading.Thread(target=hook, name="forge-stop-hook", daemon=True).start()

    def check(self) -> None:
        if self.stopping.is_set():
            raise Stopped()


class ControlledSampler:
    """The trainer's `Sampler` over the runner, cancellable from another thread.

    Cancelling the asyncio task (not the concurrent future) lets the runner's own cleanup - sandbox
    `stop()` in its `finally` blocks - finish before the trainer thread hears about it."""

    def __init__(self, runner: Any, bridge: Any, controller: RunController, *, group_size: int,
                 engine_failure: Callable[[], str | None] = lambda: None) -> None:
        self.runner, self.bridge, self.controller = runner, bridge, controller
        self.group_size = group_size
        self.engine_failure = engine_failure

    def sample(self, run_id: str, tasks: Any, *, step: int, adapter: str | None) -> list[Any]:
        self.controller.check()
        if (failure := self.engine_failure()) is not None:  # the supervisor gave up restarting it
            raise EngineError(failure)
        log.info("step %d: sampling %d task(s) x %d, adapter %s", step, len(tasks), self.group_size, adapter or "base")
        if self.controller.paused:  # the trainer marks the run running as it starts; it is not
            self.controller.store.update_run(run_id, status="paused")

        from rollouts.evaluate import eval_specs

        specs = eval_specs(list(tasks), self.group_size)  # a task's group starts (and ends) together

        async def one_step() -> list[Any]:
            self.controller._current = asyncio.current_task()
            try:
                if self.controller.stopping.is_set():  # stop() came before this task existed to cancel
                    raise asyncio.CancelledError
                return list(await self.runner.run(run_id, specs, step=step, adapter=adapter))
            finally:
                self.controller._current = None

        future: Future = self.bridge.submit(one_step())
        try:
            rollouts = future.result()
        except BaseException:
            if self.controller.stopping.is_set():
                raise Stopped() from None
            raise
        self.controller.check()
        scored = [r for r in rollouts if r.reward is not None]
        mean = sum(r.reward for r in scored) / len(scored) if scored else float("nan")
        log.info("step %d: %d rollouts, %d scored, mean reward %.3f", step, len(rollouts), len(scored), mean)
        return rollouts


# ---------------------------------------------------------------------------------------------
# The lifecycle, in the worker thread.


@dataclass
class Outcome:
    """How the run ended, for the front end to print."""

    status: str = "created"
    error: str | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)


def run_log_handler(store: Store, run_id: str) -> logging.Handler:
    path = run_log_path(store.path, run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname).1s %(name)s: %(message)s", "%H:%M:%S"))
    handler.setLevel(logging.INFO)
    return handler


@dataclass
class Services:
    engine: Any  # engine.supervisor.EngineProcess
    proxy_url: str
    runner: Any  # rollouts.runner.RolloutRunner
    client: Any  # engine.client.EngineClient, the trainer's line to the engine (adapter loads)


def bring_up(store: Store, run_id: str, config: ForgeConfig, controller: RunController,
             started: list[tuple[str, Callable[[], Any]]]) -> Services:
    """Engine and proxy start side by side (each spends its first seconds importing and loading the
    model), then the runner and the trainer's engine client. Each `stop` joins `started` as it starts."""
    from engine.client import EngineClient
    from engine.supervisor import EngineProcess

    engine_cfg = config.engine
    if engine_cfg.kind != "url" and not engine_cfg.port:  # fix the port now: the proxy needs the URL
        engine_cfg = engine_cfg.model_copy(update={"port": _free_port(engine_cfg.host)})
    engine = EngineProcess(engine_cfg, log_path=run_log_path(store.path, run_id).with_name("engine.log"),
                           lora_target_modules=config.trainer.lora_target_modules)
    started.append(("engine", engine.stop))
    failed: list[BaseException] = []

    def start_engine() -> None:
        try:
            engine.start()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the lifecycle thread below
            failed.append(exc)

    booting = threading.Thread(target=start_engine, name="forge-engine-start", daemon=True)
    booting.start()
    controller.on_stop.append(lambda: booting.is_alive() and engine.stop())  # don't wait out its startup
    try:
        proxy_url = _start_proxy(store, config, engine.url, started)
    finally:
        booting.join()
    if failed:
        raise failed[0]
    log.info("engine (%s) up at %s serving %s", config.engine.kind, engine.url, config.engine.model)
    controller.check()
    runner = _make_runner(store, config, proxy_url)
    if controller.paused:  # `p` pressed while the engine was loading
        runner.pause()
    controller.runner = runner
    client = EngineClient(engine.url, timeout=config.engine.request_timeout_s)
    started.append(("engine client", lambda: controller.bridge.run(client.aclose())))
    engine.on_restart.append(lambda: _reload_adapter(store, run_id, client, controller.bridge))
    return Services(engine=engine, proxy_url=proxy_url, runner=runner, client=client)


def _free_port(host: str) -> int:
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def run_lifecycle(store: Store, run_id: str, config: ForgeConfig, controller: RunController, *, home: Path,
                  resume: bool = False, on_step: Callable[[dict[str, Any]], None] | None = None) -> Outcome:
    """Bring up, train(), then teardown in reverse. Never raises: returns the outcome."""
    from trainer.loop import train
    from trainer.sampler import AdapterSync, BackgroundLoop

    outcome = Outcome()
    started: list[tuple[str, Callable[[], Any]]] = []  # (what, stop) in start order
    controller.bridge = bridge = BackgroundLoop()

    def step_done(metrics: dict[str, Any]) -> None:
        log.info("step %d done: reward %s, loss %s, adapter %s loaded", metrics.get("step"),
                 fmt_num(metrics.get("reward_mean")), fmt_num(metrics.get("loss")), store.get_run(run_id).current_adapter)
        outcome.steps.append(metrics)
        if on_step is not None:
            on_step(metrics)
        if int(metrics["step"]) + 1 < config.trainer.steps:  # a stop during the last step: it is done anyway
            controller.check()

    try:
        svc = bring_up(store, run_id, config, controller, started)
        sampler = ControlledSampler(svc.runner, bridge, controller, group_size=config.runner.samples_per_task,
                                    engine_failure=lambda: svc.engine.failure)
        result = train(store, run_id, config.trainer, model_path=config.engine.model, tasks=load_run_tasks(config),
                       sampler=sampler, engine=AdapterSync(svc.client, bridge), home=home, resume=resume,
                       on_step=step_done)
        outcome.status = "finished"
        log.info("finished %d step(s); the engine serves %s", len(result.steps), result.adapter or "the base model")
    except BaseException as exc:  # noqa: BLE001 - reported as the run's outcome, never a traceback on a TUI
        if isinstance(exc, KeyboardInterrupt) or controller.stopping.is_set():
            outcome.status = "stopped"  # whatever broke while stopping was the stop itself
        elif isinstance(exc, ForgeError):
            outcome.status, outcome.error = "failed", str(exc)
            log.error("%s", exc)
        else:
            outcome.status, outcome.error = "failed", f"{type(exc).__name__}: {exc}"
            log.exception("the run failed")
    finally:
        _teardown(started)
        bridge.close()
        _record_outcome(store, run_id, outcome)
    return outcome


def fmt_num(value: Any, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def _record_outcome(store: Store, run_id: str, outcome: Outcome) -> None:
    run = store.get_run(run_id)
    if outcome.status == "stopped":
        store.set_run_status(run_id, "stopped")
        store.update_run(run_id, error=None)
    elif outcome.status == "failed" and run.status != "failed":
        store.set_run_status(run_id, "failed", error=outcome.error)
    store.interrupt_unfinished(run_id)  # nothing of this run is in flight any more


def _teardown(started: list[tuple[str, Callable[[], Any]]]) -> None:
    for what, stop in reversed(started):
        try:
            stop()
            log.info("stopped the %s", what)
        except Exception as exc:  # noqa: BLE001 - keep stopping the rest
            log.warning("stopping the %s failed: %s", what, exc)


def _reload_adapter(store: Store, run_id: str, client: Any, bridge: Any) -> None:
    """A restarted engine has no adapters: load the one the run's rollouts are served with again."""
    ckpt = store.latest_checkpoint(run_id)
    if ckpt is not None and ckpt.adapter_name:
        bridge.run(client.load_lora_adapter(ckpt.adapter_name, ckpt.path))
        log.info("engine restarted: adapter %s loaded again", ckpt.adapter_name)


def _start_proxy(store: Store, config: ForgeConfig, engine_url: str,
                 started: list[tuple[str, Callable[[], Any]]]) -> str:
    from proxy.server import ProxyServer

    proxy = ProxyServer(config.proxy, store_path=store.path, engine_url=engine_url, model_path=config.engine.model)
    started.append(("proxy", proxy.stop))
    proxy.start()
    log.info("proxy up at %s", proxy.url)
    return proxy.url


def _make_runner(store: Store, config: ForgeConfig, proxy_url: str) -> Any:
    from rollouts.runner import RolloutRunner

    runner = RolloutRunner(store, config=config, proxy_url=proxy_url)
    log.info("runner: %s harness in %s sandboxes, %d at a time", config.harness.name, config.sandbox.type,
             config.runner.concurrency)
    return runner


class RunThread(threading.Thread):
    """The lifecycle in a thread; `.outcome` once it has ended."""

    def __init__(self, target: Callable[[], Outcome]) -> None:
        super().__init__(name="forge-up", daemon=True)
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
    handler = run_log_handler(store, run_id)
    root = logging.getLogger()
    root.addHandler(handler)
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
    # One line per HTTP request to the engine would drown the run's own log.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    def target() -> Outcome:
        try:
            return run_lifecycle(store, run_id, config, controller, home=home, resume=resume, on_step=on_step)
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
        if controller.stopping.is_set():
            deadline = deadline or time.monotonic() + grace_s
            if time.monotonic() > deadline:
                log.error("teardown did not finish within %.0fs", grace_s)
                return Outcome(status="stopped", error=f"teardown did not finish within {grace_s:.0f}s")
    return thread.outcome or Outcome(status="failed", error="the run thread ended without an outcome")
