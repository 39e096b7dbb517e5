"""The pieces of `forge up` that are quick to test on their own: config composition, the run row, dead
owners, resume, and the controller's pause/stop against the real RolloutRunner in local sandboxes."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from openforge.forge_cli.main import app
from openforge.forge_cli.overrides import flag_overrides
from openforge.presets import read_preset
from openforge.config import load_config
from openforge.errors import ConfigError, ForgeError
from openforge.store import Store, TrainStep
from openforge.rollouts.runner.runner import RolloutRunner
from openforge.rollouts.tasks.format import TaskSpec
from openforge.runs.control import RunController, Stopped
from openforge.runs.prepare import prepare_run, resolve_model
from openforge.trainer.bridge import BackgroundLoop
from openforge.trainer.samplers import RolloutSampler


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


DEMO_TASKS = read_preset("demo")["tasks"]["include"]


def test_demo_settings_then_set_items_then_flags() -> None:
    config = load_config(None, overrides=flag_overrides({"trainer.steps": 1, "name": "mine"}),
                         sets=["runner.samples_per_task=2", "trainer.lr=1e-3"], preset="demo")
    assert config.tasks.include == DEMO_TASKS and config.sandbox.type == "local" and config.harness.name == "mini"
    assert config.runner.samples_per_task == 2 and config.trainer.lr == 1e-3  # --set beats the demo
    assert config.trainer.steps == 1 and config.name == "mine"  # --steps / --name beat both
    assert flag_overrides({"trainer.steps": None, "name": None}) == {}


@pytest.mark.parametrize("harness", ["claude-code", "codex", "mini-gui", "browser-use"])
def test_the_demo_preset_follows_the_harness_however_it_is_named(harness: str) -> None:
    """Issue 29: `forge --set harness.name=claude-code up --demo` got the mini demo's settings (every
    rollout then failed: "Prompt is too long"); it must get what `forge up --demo --harness claude-code` gets."""
    by_flag = load_config(None, overrides=flag_overrides({"harness.name": harness}), preset="demo")
    by_set = load_config(None, sets=[f"harness.name={harness}"], preset="demo")
    assert by_set == by_flag and by_set.harness.name == harness
    own = read_preset(f"demo-{harness}")
    assert by_set.proxy.max_tokens_cap == own["proxy"]["max_tokens_cap"]
    assert by_set.runner.samples_per_task == own["runner"]["samples_per_task"]


def test_the_demo_presets_are_laid_in_order() -> None:
    """demo.toml, then demo-<harness>.toml over it: the text demo's values are tuned in its file (so only
    their layering is checked here); the harness demos keep the values their dicts had (forge_cli/overrides.py)."""
    text = read_preset("demo")
    mini = load_config(None, preset="demo")
    assert mini.model_dump(include=set(text)) == load_config(None, overrides=text).model_dump(include=set(text))
    cc = load_config(None, sets=["harness.name=claude-code"], preset="demo")
    assert (cc.tasks.include, cc.engine.max_batch_size, cc.runner.time_limit_scale, cc.proxy.max_context_tokens) == (
        ["easy-sum"], 16, 5.0, 131072)
    assert (cc.trainer.steps, cc.trainer.lr, cc.runner.samples_per_task, cc.proxy.max_tokens_cap) == (8, 3e-3, 16, 2)
    # what demo-claude-code.toml leaves unset comes from demo.toml
    assert (cc.trainer.micro_batch_tokens, cc.harness.max_tokens) == (mini.trainer.micro_batch_tokens, mini.harness.max_tokens)
    bu = load_config(None, sets=["harness.name=browser-use"], preset="demo")
    assert (bu.tasks.path, bu.harness.max_tokens, bu.harness.extra_args, bu.trainer.kl_coef, bu.trainer.lr) == (
        "builtin-web", 8, [], 0.2, 3e-3)
    assert (bu.trainer.steps, bu.runner.samples_per_task, bu.proxy.max_tokens_cap) == (3, 4, 256)


def test_a_new_run_gets_its_config_tasks_and_owner(store: Store, tiny_model: Path) -> None:
    config = load_config(None, overrides=flag_overrides({"trainer.steps": 2}), sets=[f"engine.model={tiny_model}"],
                         preset="demo")
    run_id, effective = prepare_run(store, config, home=store.path.parent)
    run = store.get_run(run_id)
    assert run.owner_pid == os.getpid() and run.kind == "train" and run.name == "demo"
    assert effective.engine.model == str(tiny_model) and effective.trainer.steps == 2
    assert sorted(t.task_id for t in store.list_tasks(run_id)) == sorted(DEMO_TASKS)


def test_resume_reopens_the_stored_config(store: Store, tiny_model: Path) -> None:
    config = load_config(None, overrides={"engine": {"model": str(tiny_model)}, "trainer": {"steps": 2}})
    run_id, _ = prepare_run(store, config, home=store.path.parent)
    store.set_run_status(run_id, "interrupted", error="killed")
    store.add_train_step(TrainStep(run_id=run_id, step=0))
    other = load_config(None, overrides={"trainer": {"steps": 9, "lr": 0.5}})  # flags of the resuming command
    same, effective = prepare_run(store, other, home=store.path.parent, resume=run_id[:14])
    assert same == run_id
    assert effective.trainer.steps == 2 and effective.trainer.lr == config.trainer.lr  # the run's own settings
    assert store.get_run(run_id).error is None and store.get_run(run_id).owner_pid == os.getpid()
    store.add_train_step(TrainStep(run_id=run_id, step=1))
    store.set_run_status(run_id, "finished")
    with pytest.raises(ForgeError, match="has done 2 of its 2 steps; give a larger --steps"):
        prepare_run(store, other, home=store.path.parent, resume=run_id)
    _, more = prepare_run(store, other, home=store.path.parent, resume=run_id, steps=3)
    assert more.trainer.steps == 3


def test_a_model_path_that_is_not_a_model(tmp_path: Path) -> None:
    config = load_config(None, overrides={"engine": {"model": str(tmp_path)}})
    with pytest.raises(ConfigError, match="is not a model folder \\(no config.json\\)"):
        resolve_model(config, tmp_path)


def test_forge_up_marks_runs_of_dead_owners_interrupted(store: Store) -> None:
    run = store.create_run(owner_pid=dead_pid())
    store.set_run_status(run.id, "running")
    ro = store.create_rollout(run_id=run.id, task_id="t")
    store.update_rollout(ro.id, status="running")
    # Preflight then refuses (no Docker there): marking happens first, whatever follows.
    out = CliRunner().invoke(app, ["--set", "sandbox.type=docker", "--set", "sandbox.base_url=unix:///nope.sock",
                                   "up", "--headless"])
    assert out.exit_code == 1 and "no Docker engine reachable at unix:///nope.sock" in out.stderr
    assert f"{run.id} was left running by a process that is gone: marked interrupted" in out.stdout.replace("\n", "")
    assert store.get_run(run.id).status == "interrupted" and store.get_rollout(ro.id).status == "interrupted"


@pytest.fixture
def runner_rig(store: Store, tmp_path: Path):
    """A real RolloutRunner (local sandboxes, no isolation so the test can see the process) on a bridge."""
    config = load_config(None, overrides={"sandbox": {"isolation": "none"},
                                          "runner": {"concurrency": 1, "verifier_timeout_s": 60}})
    run = store.create_run(config=config.model_dump(mode="json"))
    bridge = BackgroundLoop()
    runner = RolloutRunner(store, config=config, proxy_url="http://127.0.0.1:9")  # setup hangs before any call
    controller = RunController(store, run.id)
    controller.attach(runner, bridge)
    pidfile = tmp_path / "setup.pid"
    task = TaskSpec(id="hang", instruction="wait", verifier="true", setup=f"echo $$ > {pidfile}; exec sleep 60")
    yield store, run.id, controller, RolloutSampler(runner, bridge, group_size=1, cancel=controller.cancel,
                                                            before_step=controller.before_step), task, pidfile
    bridge.close()


def sample_in_thread(sampler: RolloutSampler, run_id: str, task: TaskSpec) -> tuple[threading.Thread, list]:
    outcome: list = []

    def go() -> None:
        try:
            outcome.append(sampler.sample(run_id, [task], step=0, adapter=None))
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcome.append(exc)

    thread = threading.Thread(target=go)
    thread.start()
    return thread, outcome


def wait_for(predicate, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_pause_holds_new_rollouts_and_resume_releases_them(runner_rig) -> None:
    store, run_id, controller, sampler, task, pidfile = runner_rig
    controller.pause()
    assert controller.paused and store.get_run(run_id).status == "paused"
    thread, outcome = sample_in_thread(sampler, run_id, task)
    wait_for(lambda: bool(store.list_rollouts(run_id)))
    time.sleep(0.5)
    assert [r.status for r in store.list_rollouts(run_id)] == ["pending"]  # held at the gate
    controller.resume()
    assert store.get_run(run_id).status == "running"
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() != "")
    controller.stop()
    thread.join(30)
    assert isinstance(outcome[0], Stopped)


def test_stop_cancels_the_step_and_its_sandbox_processes(runner_rig) -> None:
    store, run_id, controller, sampler, task, pidfile = runner_rig
    hooked = threading.Event()
    controller.on_stop.append(hooked.set)
    thread, outcome = sample_in_thread(sampler, run_id, task)
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() != "")
    setup_pid = int(pidfile.read_text())
    assert psutil.pid_exists(setup_pid)
    controller.stop()
    thread.join(30)
    assert isinstance(outcome[0], Stopped) and hooked.wait(5)
    assert [r.status for r in store.list_rollouts(run_id)] == ["cancelled"]
    # The runner stopped the sandbox before the sampler returned: its process is gone already.
    assert not psutil.pid_exists(setup_pid) or psutil.Process(setup_pid).status() == psutil.STATUS_ZOMBIE
    with pytest.raises(Stopped):
        controller.check()


def _signal_when_engine_launches(sig: int, children: list, *, needs_handler: bool) -> threading.Thread:
    """Send `sig` to this process once the engine child exists (and, for SIGTERM, our handler is in)."""
    import signal

    def cmdline(p: psutil.Process) -> str:
        try:
            return " ".join(p.cmdline())
        except psutil.Error:  # a sandbox's short-lived process, gone between the listing and the read
            return ""

    def send() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            kids = [p for p in psutil.Process().children(recursive=True) if "openforge.engine" in cmdline(p)]
            if kids and (not needs_handler or signal.getsignal(sig) not in (signal.SIG_DFL, None)):
                children.extend(kids)
                os.kill(os.getpid(), sig)
                return
            time.sleep(0.05)

    sender = threading.Thread(target=send)
    sender.start()
    return sender


def _demo_run(store: Store, tiny_model: Path) -> tuple[str, object, RunController]:
    # More steps than can finish before the signal lands, however late a loaded machine lets the sender
    # see the engine: a run that ends `finished` here lost the stop (one step once did, in CI).
    config = load_config(None, overrides=flag_overrides({"trainer.steps": 1000}), sets=[f"engine.model={tiny_model}"],
                         preset="demo")
    run_id, config = prepare_run(store, config, home=store.path.parent)
    return run_id, config, RunController(store, run_id)


def _assert_all_stopped(store: Store, run_id: str, outcome, children: list) -> None:
    assert children, "the engine child never started"
    assert outcome.status == "stopped" and store.get_run(run_id).status == "stopped", outcome
    assert not [p for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_the_dashboard_front_end_stops_everything_on_sigterm(store: Store, tiny_model: Path) -> None:
    """`forge up`'s TUI path (Textual without a terminal): SIGTERM while the engine is still loading
    closes the dashboard, aborts the engine start and leaves no child process."""
    import signal

    from openforge.forge_cli.up_views import run_tui

    run_id, config, controller = _demo_run(store, tiny_model)
    children: list[psutil.Process] = []
    sender = _signal_when_engine_launches(signal.SIGTERM, children, needs_handler=True)
    outcome = run_tui(store, run_id, config, controller, home=store.path.parent, resume=False,
                      exit_after_done_s=None, headless_app=True)
    sender.join()
    _assert_all_stopped(store, run_id, outcome, children)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is gone with the dashboard


def test_ctrl_c_in_headless_mode_stops_everything(store: Store, tiny_model: Path) -> None:
    import signal

    from rich.console import Console

    from openforge.forge_cli.up_views import run_headless

    run_id, config, controller = _demo_run(store, tiny_model)
    children: list[psutil.Process] = []
    # Ctrl-C as a fresh `forge up` process gets it: Python's own SIGINT handler. (Something earlier in a
    # long pytest session can leave another one installed, and then the signal never reached the run.)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        sender = _signal_when_engine_launches(signal.SIGINT, children, needs_handler=False)
        outcome = run_headless(store, run_id, config, controller, home=store.path.parent, resume=False,
                               console=Console(file=open(os.devnull, "w")))
        sender.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    _assert_all_stopped(store, run_id, outcome, children)


def test_forge_dash_without_a_terminal_says_what_to_use(store: Store) -> None:
    store.create_run()
    out = CliRunner().invoke(app, ["dash", "latest"])
    assert out.exit_code == 1
    assert out.stderr == "forge: error: forge dash needs a terminal; use `forge show RUN` to print a run's summary\n"


@pytest.mark.parametrize("command", ["train", "up"])
def test_resume_preflights_the_runs_stored_config(store: Store, command: str) -> None:
    """`forge train --resume RUN` and `forge up --resume RUN` check the config the run will run with (its
    stored one), not forge.toml's: here the stored run wants a Docker engine that is not there, while the
    command's own config (local sandboxes) would pass. The refusal leaves the run as it was."""
    stored = load_config(None, sets=["sandbox.type=docker", "sandbox.base_url=unix:///nope.sock"])
    run = store.create_run(config=stored.model_dump(mode="json"), owner_pid=dead_pid())
    store.set_run_status(run.id, "interrupted", error="killed")
    out = CliRunner().invoke(app, ["--set", "sandbox.type=local", command, "--resume", run.id, "--headless"]
                             if command == "up" else ["--set", "sandbox.type=local", command, "--resume", run.id])
    assert out.exit_code == 1 and "no Docker engine reachable at unix:///nope.sock" in out.stderr, out.output
    after = store.get_run(run.id)
    assert (after.status, after.error, after.owner_pid) == ("interrupted", "killed", run.owner_pid)


@pytest.mark.parametrize("command", ["train", "up"])
def test_training_against_a_teachers_endpoint_is_refused_in_one_line(store: Store, command: str) -> None:
    """A remote engine (a teacher behind the proxy) records SFT data; it has no weights to train."""
    sets = ["--set", "engine.kind=remote", "--set", "engine.url=http://127.0.0.1:9", "--set", "engine.upstream_model=t"]
    out = CliRunner().invoke(app, [*sets, command, *(["--headless"] if command == "up" else [])])
    assert out.exit_code == 1, out.output
    assert out.stderr.startswith('forge: error: engine.kind = "remote" is a teacher\'s endpoint') and \
        out.stderr.count("\n") == 1, out.stderr
    assert store.list_runs() == []  # refused before any run row
