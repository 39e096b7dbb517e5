"""The `forge` CLI through Typer's CliRunner: help, config, errors as one line, run inspection."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers.cli import invoke, runner
from tests.helpers.paths import REPO
from openforge.forge_cli.main import app
from openforge.errors import StoreError
from openforge.db import store_error
from openforge.store import Store, TrainStep


def test_version_and_help_of_every_command() -> None:
    result = invoke("version")
    assert result.exit_code == 0 and result.stdout.startswith("openforge ")
    top = invoke("--help")
    assert top.exit_code == 0
    import typer.main

    names = list(typer.main.get_command(app).commands)
    assert {"version", "doctor", "runs", "show", "stop", "config"} <= set(names)
    for name in names:
        res = invoke(name, "--help")
        assert res.exit_code == 0, name
        assert "Usage" in res.stdout


def test_config_show_merges_file_and_set(tmp_path: Path) -> None:
    cfg = tmp_path / "forge.toml"
    cfg.write_text('[trainer]\nlr = 3e-4\n[sandbox]\ntype = "docker"\n')
    res = invoke("--config", str(cfg), "--set", "trainer.steps=7", "config", "show")
    assert res.exit_code == 0
    assert "lr = 0.0003" in res.stdout and "steps = 7" in res.stdout and 'type = "docker"' in res.stdout


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("[trainer\nlr=1", "not valid TOML"),
        ("[trainer]\nlrr = 1", "trainer.lrr"),
        ('[sandbox]\ntype = "vm"', "sandbox.type"),
    ],
)
def test_bad_config_is_one_line_error(tmp_path: Path, content: str, needle: str) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(content)
    res = invoke("--config", str(cfg), "config", "show")
    assert res.exit_code == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("forge: error:") and needle in lines[0]


def test_missing_config_and_bad_set() -> None:
    res = invoke("--config", "/nonexistent/forge.toml", "config", "show")
    assert res.exit_code == 1 and "config file not found" in res.stderr
    res = invoke("--set", "novalue", "config", "show")
    assert res.exit_code == 1 and "KEY=VALUE" in res.stderr


@pytest.mark.parametrize(
    ("args", "usage", "needle"),
    [
        (["up", "--nope"], "up [OPTIONS]", "No such option: --nope"),
        (["up", "--steps", "abc"], "up [OPTIONS]", "Invalid value for '--steps'"),
        (["train", "--steps", "0"], "train [OPTIONS]", "Invalid value for '--steps'"),
        (["train", "--lr", "fast"], "train [OPTIONS]", "Invalid value for '--lr'"),
        (["eval", "--samples"], "eval [OPTIONS]", "Option '--samples' requires an argument"),
        (["show"], "show [OPTIONS]", "Missing argument 'run_id'"),
        (["runs", "--limit", "many"], "runs [OPTIONS]", "Invalid value for '--limit'"),
        (["tasks", "validate", "--run=yes", "builtin"], "tasks validate [OPTIONS]", "does not take a value"),
        (["tasks", "nope"], "tasks [OPTIONS] COMMAND", "No such command 'nope'"),
        (["nosuchcommand"], "[OPTIONS] COMMAND", "No such command 'nosuchcommand'"),
        (["--set"], "[OPTIONS] COMMAND", "Option '--set' requires an argument"),
    ],
)
def test_a_bad_option_is_a_usage_error(args: list[str], usage: str, needle: str) -> None:
    res = invoke(*args)
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2, res.stderr
    assert lines[0].startswith("Usage: ") and usage in lines[0], lines
    assert lines[-1].startswith("forge: error: ") and needle in lines[-1], lines
    assert len(lines) == 3 and "internal error" not in res.stderr and "Traceback" not in res.stderr


def test_unknown_run_is_one_line_error() -> None:
    for cmd in ("show", "stop"):
        res = invoke(cmd, "run-nope")
        assert res.exit_code == 1
        assert res.stderr.strip().splitlines() == [res.stderr.strip()]
        assert "no run 'run-nope'" in res.stderr


def test_runs_and_show_read_the_store(forge_home: Path) -> None:
    store = Store(forge_home / "forge.db")
    run = store.create_run(name="my-run")
    ro = store.create_rollout(run_id=run.id, task_id="t1")
    store.update_rollout(ro.id, status="scored", reward=1.0)
    store.add_train_step(TrainStep(run_id=run.id, step=0, loss=0.5, reward_mean=1.0))
    res = invoke("runs")
    assert res.exit_code == 0 and "my-run" in res.stdout
    res = invoke("show", "latest")
    assert res.exit_code == 0
    assert run.id in res.stdout and "scored 1" in res.stdout and "mean reward 1.000" in res.stdout
    assert "train steps" in res.stdout


def test_stop_without_live_owner_marks_stopped(forge_home: Path) -> None:
    store = Store(forge_home / "forge.db")
    run = store.create_run(name="r", owner_pid=None)
    store.set_run_status(run.id, "running")
    ro = store.create_rollout(run_id=run.id, task_id="t", status="running")
    res = invoke("stop", run.id)
    assert res.exit_code == 0 and "marked stopped" in res.stdout
    assert store.get_run(run.id).status == "stopped"
    assert store.get_rollout(ro.id).status == "interrupted"
    res = invoke("stop", run.id)
    assert res.exit_code == 1 and "not running" in res.stderr


def test_home_flag_overrides_env(tmp_path: Path) -> None:
    other = tmp_path / "elsewhere"
    res = invoke("--home", str(other), "runs")
    assert res.exit_code == 0
    assert (other / "forge.db").exists()


def test_unwritable_home_is_one_line_error(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        target = "/proc/forge-cannot-exist"  # root ignores permission bits; /proc refuses everyone
    else:
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        target = str(ro / "home")
    res = invoke("--home", target, "runs")
    assert res.exit_code == 1 and res.stderr.startswith("forge: error:")


def test_doctor_reports_each_item() -> None:
    res = invoke("doctor")
    assert res.exit_code == 0
    for item in ("torch", "GPU", "bubblewrap", "Docker engine", "Kubernetes", "SGLang", "node/npm"):
        assert item in res.stdout


@pytest.mark.parametrize(
    ("message", "needle"),
    [("database is locked", "locked"), ("database or disk is full", "no space left"),
     ("file is not a database", "move it aside")],
)
def test_sqlite_errors_become_clear_lines(message: str, needle: str) -> None:
    import sqlite3

    err = store_error(sqlite3.OperationalError(message), Path("/x/forge.db"))
    assert isinstance(err, StoreError) and needle in str(err)


def test_show_lists_failure_reasons_with_counts(forge_home: Path) -> None:
    store = Store(forge_home / "forge.db")
    run = store.create_run(name="r")
    for reason, n, kind in (("harness: API error 400: prompt too long", 3, "harness"),
                            ("infra: sandbox failed to start after 3 attempt(s): no space", 1, "infra")):
        for _ in range(n):
            ro = store.create_rollout(run_id=run.id, task_id="t")
            store.update_rollout(ro.id, status="failed", failure_kind=kind, error=reason + "\nsecond line")
    ok = store.create_rollout(run_id=run.id, task_id="t")
    store.update_rollout(ok.id, status="scored", reward=1.0, error="verifier note: not a failure")
    res = runner.invoke(app, ["show", run.id], terminal_width=160)
    assert res.exit_code == 0
    rows = [line.strip("│ ").split("│") for line in res.stdout.splitlines() if line.startswith("│")]
    assert [(n.strip(), reason.strip()) for n, reason in rows] == [
        ("3", "harness: API error 400: prompt too long"),
        ("1", "infra: sandbox failed to start after 3 attempt(s): no space")]  # most frequent first


def test_runs_never_cuts_the_run_id_at_80_columns(forge_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 29: at 80 columns the id column was cut ("run-20261204-…"), and the id could not be copied."""
    monkeypatch.setenv("COLUMNS", "80")
    store = Store(forge_home / "forge.db")
    run = store.create_run(name="a-rather-long-human-name-for-this-particular-run", kind="train")
    for _ in range(3):
        store.create_rollout(run_id=run.id, task_id="t")
    store.add_train_step(TrainStep(run_id=run.id, step=0))
    res = invoke("runs")
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    row = next(line for line in lines if run.id in line)  # the whole id, on one line
    cells = [cell.strip() for cell in row.strip("│ ").split("│")]
    assert cells[0] == run.id and cells[-2:] == ["3", "1"]  # rollouts and steps, counted in SQL
    assert max(len(line) for line in lines if line.startswith(("│", "┃", "┏", "└"))) <= 80


def test_stop_signals_a_live_owner(store: Store) -> None:
    import signal
    import subprocess

    from openforge.runs.control import StopRequested, stop_run

    owner = subprocess.Popen(["sleep", "30"])
    try:
        run = store.create_run(name="r", owner_pid=owner.pid)
        store.set_run_status(run.id, "running")
        assert stop_run(store, run.id[:12]) == StopRequested(run.id, owner.pid)
        assert owner.wait(timeout=10) == -signal.SIGTERM
        assert store.get_run(run.id).status == "running"  # the owner records how its run ended, not `forge stop`
    finally:
        owner.kill()
        owner.wait()


def test_doctor_says_how_to_install_a_missing_npm_harness(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 29: doctor said harnesses are "installed on first use" while `forge up` refuses a missing one
    and asks for `forge harness install`: doctor now says that."""
    import shutil

    if shutil.which("node") is None or shutil.which("npm") is None or shutil.which("codex"):
        pytest.skip("needs node and npm, and no codex on the PATH")
    monkeypatch.setenv("COLUMNS", "400")
    res = invoke("doctor")  # FORGE_HOME is a fresh temp dir: its npm cache is empty
    assert res.exit_code == 0 and "installed on first use" not in res.stdout
    assert "run `forge harness install codex` before using it" in res.stdout


def test_the_kubernetes_client_is_a_dependency_imported_only_when_used() -> None:
    """Issue 29: doctor advised `pip install 'openforge'` for a client that was an extra. It is a default
    dependency now (`[k8s]` stays as an empty alias), and `forge` still starts without importing it."""
    import subprocess
    import sys
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "kubernetes>=37,<38" in project["dependencies"] and project["optional-dependencies"]["k8s"] == []
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "openforge.forge_cli.main", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "Usage" in out.stdout
    imported = [line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")]
    assert "typer" in imported and not [m for m in imported if m.split(".")[0] == "kubernetes"]


def test_forge_starts_without_importing_torch() -> None:
    """`forge --help` (and every command that trains nothing) starts without torch, transformers or peft:
    `forge sft` imported runs/sft.py at start, which cost every `forge` invocation over a second."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "openforge.forge_cli.main", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "Usage" in out.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "typer" in imported and not imported & {"torch", "transformers", "peft"}
