"""`forge up`: bring up the engine, the proxy, the rollout runner and the trainer for one run, and take
every one of them down again, whatever ends the run (its last step, `q`, Ctrl-C, SIGTERM, an error).

    run_id = prepare_run(store, config, home=home)                  # main thread: the run row, tasks
    controller = RunController(store, run_id)                       # what the dashboard's p / q drive
    thread = start_run_thread(store, run_id, config, controller, home=home)
    ...                                                             # the dashboard, or headless printing
    controller.stop(); thread.join()

The whole lifecycle runs in one worker thread (`run_lifecycle`), because the trainer is plain
synchronous PyTorch and the front end (Textual, or Rich progress) owns the main thread, where signals
arrive. The order is fixed: engine -> proxy -> runner -> train(); teardown is the reverse, in a
`finally`, so a failure at any stage still stops what was started before it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forge_cli.snapshot import run_log_path
from openforge.config import ForgeConfig, parse_override
from openforge.errors import ConfigError, EngineError, ForgeError, SandboxError
from openforge.paths import default_tiny_model
from openforge.store import RUN_FINAL, Store

log = logging.getLogger("forge.up")

# `forge up --demo`: small enough to finish in a minute or two on 2 CPU cores. The tiny model is random,
# so its answers are noise; these two tasks reward any answer containing the right digit (0.2 for an
# answer, 1.0 with the digit), which noise sometimes does: groups get different rewards and GRPO a
# non-zero advantage to learn from.
DEMO_TASKS = ["easy-sum", "easy-count-words"]
DEMO_OVERRIDES: dict[str, Any] = {
    "name": "demo",
    "engine": {"kind": "embedded", "max_batch_size": 8},
    "sandbox": {"type": "local"},
    "harness": {"name": "mini", "max_turns": 2, "max_tokens": 12},
    "tasks": {"path": "builtin", "include": DEMO_TASKS},
    "runner": {"samples_per_task": 4, "concurrency": 4, "rollout_timeout_s": 120.0},
    "proxy": {"default_max_tokens": 12, "max_context_tokens": 4096},
    "trainer": {"steps": 3, "tasks_per_step": 2, "lr": 5e-3, "micro_batch_tokens": 2048},
}


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def cli_overrides(*, demo: bool, sets: list[str], steps: int | None, name: str | None) -> dict[str, Any]:
    """Flags as config overrides: the demo's settings, then `--set` items, then --steps/--name on top."""
    data: dict[str, Any] = dict(DEMO_OVERRIDES) if demo else {}
    for item in sets:
        data = _merge(data, parse_override(item))
    if steps is not None:
        data = _merge(data, {"trainer": {"steps": steps}})
    if name is not None:
        data["name"] = name
    return data


def pid_alive(pid: int) -> bool:
    """Whether a run's owner still lives (a zombie - killed, not yet reaped - does not)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # alive, owned by someone else
        return True


# ---------------------------------------------------------------------------------------------
# Before anything starts: the config, the model, what the machine can do, the run row.


def resolve_model(config: ForgeConfig, home: Path) -> Path:
    """The model folder the engine and the trainer load; the tiny model is built when it is the default."""
    if config.engine.kind == "url" and not config.engine.model:
        raise ConfigError("engine.kind = \"url\" needs engine.model: the local copy of the served checkpoint "
                          "(the trainer and the proxy's tokenizer load it)")
    path = Path(config.engine.model).expanduser() if config.engine.model else default_tiny_model(home)
    if not config.engine.model and not (path / "config.json").is_file():
        from engine.tiny import build_tiny_model

        log.info("building the tiny model in %s", path)
        build_tiny_model(path)
    if not (path / "config.json").is_file():
        raise ConfigError(f"engine.model {path} is not a model folder (no config.json); "
                          "point it at a Hugging Face checkpoint directory, or leave it empty for the tiny model")
    return path


def preflight(config: ForgeConfig, home: Path) -> None:
    """Refuse early, with the fix, when the config asks for something this machine lacks."""
    from forge_cli.doctor import check_docker, check_kubernetes, check_sglang

    if config.sandbox.type == "docker":
        check = check_docker(config)
        if check.verdict != "ok":
            url = config.sandbox.docker.base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
            why = "the docker SDK is not installed; " if "SDK" in check.detail else ""
            raise SandboxError(f"no Docker engine reachable at {url}; {why}use sandbox.type = \"local\" or start Docker")
    if config.sandbox.type == "kubernetes":
        check = check_kubernetes(config)
        if check.verdict != "ok":
            raise SandboxError(f"Kubernetes: {check.detail}; use sandbox.type = \"local\" or \"docker\", "
                               "or set sandbox.kubernetes.context / kubeconfig")
    if config.engine.kind == "sglang":
        check = check_sglang(config)
        if check.verdict != "ok":
            raise EngineError(f"SGLang is {check.detail}; or use engine.kind = \"embedded\" "
                              "(CPU) or \"url\" for a server that is already running")
    if config.engine.kind == "url" and not config.engine.url:
        raise ConfigError("engine.kind = \"url\" needs engine.url (e.g. http://gpu-box:30000)")


def load_run_tasks(config: ForgeConfig) -> list[Any]:
    from rollouts.tasks import load_tasks

    tasks = load_tasks(config.tasks.path, include=config.tasks.include or None)
    if not tasks:
        raise ConfigError(f"the task set {config.tasks.path} is empty")
    return tasks


def mark_dead_runs(store: Store) -> list[str]:
    """Runs whose driving process died (SIGKILL, a crash, a reboot) become `interrupted`."""
    return store.mark_interrupted(alive=pid_alive)


def prepare_run(store: Store, config: ForgeConfig, *, home: Path, resume: str | None = None,
                steps: int | None = None) -> tuple[str, ForgeConfig]:
    """Create the run (or reopen `resume` with its stored config) and copy its tasks in.

    Returns the run id and the effective config, whose `engine.model` is the resolved model folder."""
    if resume is None:
        model = resolve_model(config, home)
        config = config.model_copy(update={"engine": config.engine.model_copy(update={"model": str(model)})})
        tasks = load_run_tasks(config)
        run = store.create_run(kind="train", name=config.name, config=config.model_dump(mode="json"),
                               owner_pid=os.getpid())
        store.add_tasks(run.id, [t.to_record() for t in tasks])
        return run.id, config
    run = store.get_run(resume)
    if run.status not in RUN_FINAL:
        raise ForgeError(f"run {run.id} is {run.status} (driven by pid {run.owner_pid}); "
                         f"stop it first with `forge stop {run.id}`")
    config = ForgeConfig.model_validate_json(run.config_json) if run.config_json else config
    if steps is not None:
        config.trainer.steps = steps
    done = len(store.list_train_steps(run.id))
    if done >= config.trainer.steps:
        raise ForgeError(f"run {run.id} has done {done} of its {config.trainer.steps} steps; "
                         "give a larger --steps to train it further")
    resolve_model(config, home)
    store.update_run(run.id, owner_pid=os.getpid(), error=None, ended_at=None, config=config.model_dump(mode="json"))
    return run.id, config


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

        from rollouts.evaluate import eval_specs

        specs = eval_specs(list(tasks), self.group_size)  # a task's group starts (and ends) together

        async def one_step() -> list[Any]:
            self.controller._current = asyncio.current_task()
            try:
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


def run_lifecycle(store: Store, run_id: str, config: ForgeConfig, controller: RunController, *, home: Path,
                  resume: bool = False, on_step: Callable[[dict[str, Any]], None] | None = None) -> Outcome:
    """Engine -> proxy -> runner -> train(), then teardown in reverse. Never raises: returns the outcome."""
    from trainer.sampler import AdapterSync, BackgroundLoop

    outcome = Outcome()
    started: list[tuple[str, Callable[[], Any]]] = []  # (what, stop) in start order
    bridge = BackgroundLoop()
    controller.bridge = bridge
    try:
        engine = _start_engine(store, run_id, config, started)
        controller.check()
        proxy_url = _start_proxy(store, config, engine.url, started)
        controller.check()
        runner = _make_runner(store, config, proxy_url)
        controller.runner = runner
        from engine.client import EngineClient

        client = EngineClient(engine.url, timeout=config.engine.request_timeout_s)
        started.append(("engine client", lambda: bridge.run(client.aclose())))
        engine.on_restart.append(lambda: _reload_adapter(store, run_id, client, bridge))
        from trainer.loop import train

        def step_done(metrics: dict[str, Any]) -> None:
            log.info("step %d done: reward %s, loss %s, adapter %s loaded", metrics.get("step"),
                     fmt_num(metrics.get("reward_mean")), fmt_num(metrics.get("loss")),
                     store.get_run(run_id).current_adapter)
            outcome.steps.append(metrics)
            if on_step is not None:
                on_step(metrics)
            controller.check()

        result = train(store, run_id, config.trainer, model_path=config.engine.model, tasks=load_run_tasks(config),
                       sampler=ControlledSampler(runner, bridge, controller, group_size=config.runner.samples_per_task,
                                                 engine_failure=lambda: engine.failure), engine=AdapterSync(client, bridge),
                       home=home, resume=resume, on_step=step_done)
        outcome.status = "finished"
        log.info("finished %d step(s); the engine serves %s", len(result.steps), result.adapter or "the base model")
    except KeyboardInterrupt:  # Stopped, or Ctrl-C that reached this thread
        outcome.status = "stopped"
    except ForgeError as exc:
        outcome.status, outcome.error = "failed", str(exc)
        log.error("%s", exc)
    except Exception as exc:  # noqa: BLE001 - reported as the run's error, not a traceback on a TUI
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


def _start_engine(store: Store, run_id: str, config: ForgeConfig,
                  started: list[tuple[str, Callable[[], Any]]]) -> Any:
    from engine.supervisor import EngineProcess

    engine = EngineProcess(config.engine, log_path=run_log_path(store.path, run_id).with_name("engine.log"),
                           lora_target_modules=config.trainer.lora_target_modules)
    started.append(("engine", engine.stop))
    engine.start()
    log.info("engine (%s) up at %s serving %s", config.engine.kind, engine.url, config.engine.model)
    return engine


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

    def run(self) -> None:
        self.outcome = self._target_fn()


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
    while thread.is_alive():
        try:
            thread.join(0.5)
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
