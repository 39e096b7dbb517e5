"""Failed runs say why (#12): forge up/train/eval refuse before starting what cannot work (the harness
is not installed, no isolation), record the run's isolation, and a step whose every rollout failed
for infra or harness reasons ends the run `failed` with the most frequent reason and exit 1."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from openforge.forge_cli.main import app
from openforge.store import Store
from tests.helpers.up import forge

ONE_GROUP = ["--set", "runner.samples_per_task=2", "--set", "trainer.tasks_per_step=1", "--set", "runner.concurrency=2"]


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("command", [["up", "--headless"], ["train"], ["eval"]])
def test_a_harness_that_is_not_installed_is_refused_with_the_fix(command: list[str], tmp_path: Path,
                                                                  forge_home: Path) -> None:
    empty = tmp_path / "npm"
    out = cli("--set", "harness.name=claude-code", "--set", f"harness.npm_cache={empty}", *command)
    assert out.exit_code == 1, out.output
    (line,) = out.stderr.strip().splitlines()
    assert line == (f"forge: error: harness 'claude-code' is not installed in {empty}: "
                    f"run `forge harness install claude-code --cache {empty}`")
    assert not Store(forge_home / "forge.db").list_runs()  # refused before a run existed


@pytest.fixture
def no_bubblewrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """This process on a machine without bubblewrap: nothing on PATH (the probe is cached per process)."""
    from openforge.sandbox.local import bwrap_usable

    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    bwrap_usable.cache_clear()
    yield
    monkeypatch.undo()
    bwrap_usable.cache_clear()


@pytest.mark.parametrize("command", [["up", "--headless"], ["train"], ["eval"]])
def test_no_isolation_is_refused_unless_chosen(command: list[str], forge_home: Path, no_bubblewrap: None) -> None:
    out = cli(*command)
    assert out.exit_code == 1, out.output
    (line,) = out.stderr.strip().splitlines()
    assert "local sandboxes cannot be isolated here" in line and "apt-get install bubblewrap" in line
    assert 'set sandbox.isolation = "none"' in line
    assert not Store(forge_home / "forge.db").list_runs()


def test_the_run_records_its_isolation(store: Store, tiny_model: Path, request: pytest.FixtureRequest) -> None:
    from openforge.config import load_config
    from openforge.runs.prepare import prepare_run

    config = load_config(None, overrides={"engine": {"model": str(tiny_model)}})
    run_id, _ = prepare_run(store, config, home=store.path.parent)
    assert store.get_run(run_id).isolation == "bwrap-userns"  # bubblewrap is installed on this machine
    unisolated = load_config(None, overrides={"engine": {"model": str(tiny_model)},
                                              "sandbox": {"isolation": "none"}})
    request.getfixturevalue("no_bubblewrap")
    run_id, _ = prepare_run(store, unisolated, home=store.path.parent)
    assert store.get_run(run_id).isolation == "none"


@pytest.fixture
def failing_tasks(tmp_path: Path) -> Path:
    """A task whose setup command fails: every rollout of it is an infrastructure failure."""
    path = tmp_path / "broken.jsonl"
    task = {"id": "broken-setup", "instruction": "say hi", "setup": "echo 'no such fixture' >&2; exit 3",
            "verifier": "echo score: 1"}
    path.write_text(json.dumps(task) + "\n")
    return path


@pytest.mark.slow
def test_a_step_whose_every_rollout_failed_ends_the_run_failed(forge_home: Path, tiny_model: Path,
                                                               failing_tasks: Path) -> None:
    out = forge(forge_home, *ONE_GROUP, "--set", f"engine.model={tiny_model}", "--set",
                f"tasks.path={failing_tasks}", "train", "--steps", "2")
    assert out.returncode == 1, out.stdout + out.stderr
    reason = "infra: task setup exited 3: no such fixture"
    assert ("every rollout of step 0 failed (2); the most frequent reason (2 of 2): " + reason) in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("forge: error: run ")
    store = Store(forge_home / "forge.db")
    run = store.get_run("latest")
    assert run.status == "failed" and reason in (run.error or "")
    assert not store.list_train_steps(run.id)  # nothing was trained on, and step 1 never started
    assert {r.step for r in store.list_rollouts(run.id)} == {0}

    show = CliRunner().invoke(app, ["--home", str(forge_home), "show", run.id])
    assert show.exit_code == 0
    assert "failed rollouts by reason" in show.stdout
    assert re.search(r"│\s*2\s*│\s*" + re.escape(reason), show.stdout), show.stdout  # the count, then the reason


@pytest.mark.slow
def test_an_eval_whose_every_rollout_failed_exits_non_zero(forge_home: Path, tiny_model: Path,
                                                           failing_tasks: Path) -> None:
    out = cli("--set", f"engine.model={tiny_model}", "eval", "--tasks", str(failing_tasks), "-k", "2")
    assert out.exit_code == 1, out.output
    assert "the most frequent reason (2 of 2): infra: task setup exited 3: no such fixture" in out.stderr
    run = Store(forge_home / "forge.db").get_run("latest")
    assert run.kind == "eval" and run.status == "failed" and run.isolation == "bwrap-userns"


@pytest.mark.slow
def test_a_harness_that_fails_every_rollout_fails_the_eval(forge_home: Path, tiny_model: Path,
                                                          tmp_path: Path) -> None:
    """A command that fails: an install of `codex` that exits 1 with Codex's own `turn.failed` event."""
    cache = tmp_path / "npm"
    (cache / "node_modules" / ".bin").mkdir(parents=True)
    fake = cache / "node_modules" / ".bin" / "codex"
    event = '{"type":"turn.failed","error":{"message":"stream disconnected before completion: connection refused"}}'
    fake.write_text(f"#!/bin/sh\necho '{event}'\nexit 1\n")
    fake.chmod(0o755)
    out = cli("--set", f"engine.model={tiny_model}", "--set", "harness.name=codex", "--set",
              f"harness.npm_cache={cache}", "eval", "--tasks", "builtin", "--task", "easy-say-done", "-k", "2")
    assert out.exit_code == 1, out.output
    reason = "harness: codex exited 1: stream disconnected before completion: connection refused"
    assert f"the most frequent reason (2 of 2): {reason}" in out.stderr
    store = Store(forge_home / "forge.db")
    run = store.get_run("latest")
    assert run.status == "failed" and reason in (run.error or "")
    assert [(r.failure_kind, r.reward) for r in store.list_rollouts(run.id)] == [("harness", None)] * 2
