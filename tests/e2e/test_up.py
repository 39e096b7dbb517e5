"""`forge up` end to end: the real engine child, proxy, mini harness in local sandboxes and the GRPO
trainer on the tiny model, driven through the `forge` command line as a user would."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from openforge.store import Store
from tests.helpers.up import SMALL, forge, home_with_model, served_with_adapter, spawn  # noqa: F401 - fixtures


def wait_until(predicate, what: str, timeout: float = 180, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"forge exited with {proc.returncode} before {what}:\n{proc.stdout.read()}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.3)


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.slow
def test_demo_headless_trains_and_hot_loads(forge_home: Path) -> None:
    out = forge(forge_home, *SMALL, "up", "--demo", "--headless", "--steps", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    assert (forge_home / "models" / "tiny" / "config.json").is_file()  # built because it was missing
    assert f"stored in {forge_home / 'forge.db'}" in out.stdout.replace("\n", "")
    assert "step 0 (1 of 2)" in out.stdout and "step 1 (2 of 2)" in out.stdout

    store = Store(forge_home / "forge.db")
    run = store.get_run("latest")
    assert run.status == "finished" and run.owner_pid is not None
    rollouts = store.list_rollouts(run.id)
    assert len(rollouts) == 4 and all(r.status == "scored" and r.reward is not None for r in rollouts)
    assert all(r.n_calls >= 1 and r.harness == "mini" and r.sandbox == "local" for r in rollouts)
    assert len(store.list_trajectories(rollout_ids=[r.id for r in rollouts])) >= 4
    steps = store.list_train_steps(run.id)
    assert [s.step for s in steps] == [0, 1] and all(s.loss is not None and s.n_tokens > 0 for s in steps)
    ckpts = store.list_checkpoints(run.id)
    assert [c.loaded for c in ckpts] == [True, True] and all(Path(c.path).is_dir() for c in ckpts)
    # Step 1 was sampled with step 0's adapter, hot-loaded into the running engine.
    assert served_with_adapter(store, run.id, 1, f"{run.id}-step-0")
    assert run.current_adapter == f"{run.id}-step-1"
    log = (forge_home / "runs" / run.id / "forge.log").read_text()
    assert "step 0 done" in log and "stopped the engine" in log
    assert run.config_json["harness"]["name"] == "mini"
    check_demo_analysis(store, run.id, forge_home)


def check_demo_analysis(store: Store, run_id: str, home: Path) -> None:
    """`forge analyze --by step --html` on the demo run: first vs last step, every figure from the store."""
    import json

    out = cli("analyze", "latest", "--by", "step", "--json", "--html", str(home / "analyze.html"))
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert [(g["key"], g["n_rollouts"]) for g in report["groups"]] == [("step 0", 2), ("step 1", 2)]
    calls = [c for c in store.list_calls(run_id=run_id) if c.status == "ok"]
    rewards: dict[int, list[float]] = {0: [], 1: []}
    for row, ro in zip(sorted(report["rollouts"], key=lambda r: r["rollout_id"]),
                       sorted(store.list_rollouts(run_id), key=lambda r: r.id)):
        mine = [c for c in calls if c.rollout_id == ro.id]
        assert (row["rollout_id"], row["step"], row["reward"], row["harness"]) == (ro.id, ro.step, ro.reward, "mini")
        assert row["turns"] == len(mine) and row["tool_calls"] == sum(len(c.tool_calls_json or []) for c in mine)
        assert row["tokens_per_turn"] == sum(c.completion_tokens for c in mine) / len(mine)
        rewards[ro.step].append(ro.reward)
    first, last = report["groups"]
    assert first["metrics"]["reward"]["mean"] == sum(rewards[0]) / 2
    assert last["pass_at"]["1"] == sum(r >= 1.0 for r in rewards[1]) / 2  # one task a step
    [change] = report["changes"]
    assert change["metrics"]["reward"]["mean"] == pytest.approx(sum(rewards[1]) / 2 - sum(rewards[0]) / 2)
    page = (home / "analyze.html").read_text()
    assert "<th>step 0<br><small>n=2</small></th>" in page and 'aria-label="reward by step"' in page


@pytest.mark.slow
def test_forge_stop_leaves_no_process_and_resume_finishes(home_with_model: Path) -> None:
    """SIGTERM (`forge stop`) mid-step stops every child; `--resume` continues after the last checkpoint.
    (A SIGKILLed owner is the same to the store once `forge up` marks it interrupted: test_up_parts.)"""
    home = home_with_model
    # Step 1 must still be running when `forge stop` (a new process: seconds of imports) lands: six
    # rollouts one at a time keep it busy for several seconds even on an idle machine.
    proc = spawn(home, *SMALL, "--set", "runner.samples_per_task=6", "--set", "runner.concurrency=1",
                 "up", "--demo", "--headless", "--steps", "2")
    store = Store(home / "forge.db")

    children: list = []

    def second_step_running() -> bool:
        runs = store.list_runs()
        if not (runs and store.list_train_steps(runs[0].id)
                and any(r.status == "running" for r in store.list_rollouts(runs[0].id, step=1))):
            return False
        # The engine and a harness in its sandbox: a rollout is "running" a moment before its sandbox
        # starts and after its harness exits, so wait for both processes to be there at once.
        children[:] = descendants(proc.pid)
        return len(children) >= 2

    wait_until(second_step_running, "a rollout of the second step to run in its sandbox", proc=proc)
    stop = forge(home, "stop", "latest", timeout=60)
    assert stop.returncode == 0 and "SIGTERM" in stop.stdout, stop.stdout + stop.stderr
    output, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, output
    assert not alive(children), [p.cmdline() for p in alive(children)]
    run = store.get_run("latest")
    assert run.status == "stopped" and run.error is None
    assert not store.list_rollouts(run.id, status="running") and not store.list_rollouts(run.id, status="pending")
    assert f"forge up --resume {run.id}" in output.replace("\n", "")

    out = forge(home, "up", "--resume", run.id, "--headless")
    assert out.returncode == 0, out.stdout + out.stderr
    run = store.get_run(run.id)
    assert run.status == "finished"
    assert [s.step for s in store.list_train_steps(run.id)] == [0, 1]
    # The fresh engine got step 0's adapter back before step 1 was sampled again with it.
    assert served_with_adapter(store, run.id, 1, f"{run.id}-step-0")
    assert run.current_adapter == f"{run.id}-step-1"


def cli(*args: str):
    """In-process, for the quick refusals (a subprocess costs seconds of imports here)."""
    from typer.testing import CliRunner

    from openforge.forge_cli.main import app

    return CliRunner().invoke(app, list(args))


def test_up_refuses_what_this_machine_lacks(forge_home: Path) -> None:
    out = cli("--set", "sandbox.type=docker", "--set", "sandbox.base_url=unix:///nonexistent.sock",
              "up", "--headless")
    assert out.exit_code == 1
    assert out.stderr == ("forge: error: no Docker engine reachable at unix:///nonexistent.sock; "
                          "use sandbox.type = \"local\" or start Docker\n")
    assert not Store(forge_home / "forge.db").list_runs()  # refused before a run was created


def test_resume_of_an_unknown_or_live_run_is_one_line(forge_home: Path) -> None:
    out = cli("up", "--resume", "nope", "--headless")
    assert out.exit_code == 1 and out.stderr.startswith("forge: error: no run 'nope'")
    store = Store(forge_home / "forge.db")
    run = store.create_run(owner_pid=os.getpid())  # this test process: alive
    store.set_run_status(run.id, "running")
    out = cli("up", "--resume", run.id, "--headless")
    assert out.exit_code == 1 and f"run {run.id} is running" in out.stderr and "forge stop" in out.stderr
