"""`forge eval` end to end: the CLI starts the proxy in front of an engine (a ScriptedEngine at
--engine-url), runs every task k times through the mini harness in local sandboxes, prints the table
and stores it as the eval run's summary."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers.paths import REPO
from openforge.engine.scripted import ScriptedEngine
from openforge.engine.serve import serve_in_thread
from openforge.forge_cli.main import app
from openforge.store import Store


def test_forge_eval_prints_and_stores_pass_at_k(tiny_model: Path, store: Store) -> None:
    engine = ScriptedEngine(tiny_model, lambda ids: "hello world")  # right for one task, wrong for the other
    with serve_in_thread(engine.app) as eng:
        out = CliRunner().invoke(app, [
            "eval", "--tasks", "builtin", "--task", "easy-say-hello", "--task", "easy-say-done", "-k", "2",
            "--pass-k", "1", "--pass-k", "2", "--concurrency", "4", "--engine-url", eng.url,
            "--model", str(tiny_model), "--name", "smoke"])
    assert out.exit_code == 0, out.output
    assert "easy-say-hello" in out.output and "p@2" in out.output
    assert "pass@1 0.50, pass@2 0.50 over 4; no infra failures" in out.output
    [run] = store.list_runs()
    assert (run.kind, run.status, run.name) == ("eval", "finished", "smoke")
    summary = run.summary_json
    tasks = {t["task_id"]: t for t in summary["tasks"]}
    assert tasks["easy-say-hello"]["mean_reward"] == pytest.approx(1.0)
    assert tasks["easy-say-done"]["mean_reward"] == 0.0  # a wrong answer earns nothing, however long
    assert summary["pass_at"] == {"1": pytest.approx(0.5), "2": pytest.approx(0.5)}
    assert summary["calls"] == 4 and summary["tokens"] > 0 and summary["samples"] == 2
    assert {r.status for r in store.list_rollouts(run.id)} == {"scored"}


@pytest.mark.slow
def test_forge_eval_says_how_many_infra_failures_pass_at_k_leaves_out(tiny_model: Path, store: Store) -> None:
    """The engine fails the first rollout's call and the SDK's one retry: that rollout is an infra
    failure, left out of n, and said beside the figure, never silently."""
    engine = ScriptedEngine(tiny_model, lambda ids: "hello world")
    engine.fail_next()
    engine.fail_next()
    with serve_in_thread(engine.app) as eng:
        out = CliRunner().invoke(app, [
            "eval", "--tasks", "builtin", "--task", "easy-say-hello", "-k", "3", "--pass-k", "1",
            "--concurrency", "1", "--engine-url", eng.url, "--model", str(tiny_model)])
    assert out.exit_code == 0, out.output
    [first, *rest] = store.list_rollouts(store.list_runs()[0].id)
    assert (first.status, first.failure_kind) == ("failed", "infra") and [r.reward for r in rest] == [1.0, 1.0]
    assert "pass@1 1.00 over 2; 1 infra failure excluded" in out.output


def test_forge_eval_bad_input_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x"}\n')
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such.sock")
    for args, line in ((["--tasks", str(bad)], "forge: error: 2 problem(s) in task set"),
                       (["--task", "nope"], "forge: error: task set builtin has no task(s) nope"),
                       (["--sandbox", "docker", "--limit", "1"], "forge: error: no Docker engine reachable at unix://")):
        out = CliRunner().invoke(app, ["eval", *args])
        assert out.exit_code == 1 and out.output.startswith(line) and len(out.output.splitlines()) == 1, out.output


def test_sigterm_stops_forge_eval_and_every_sandbox(tiny_model: Path, forge_home: Path) -> None:
    """`forge stop` sends SIGTERM to the owner: the eval must cancel, stop its sandboxes, and say so."""
    import os
    import signal
    import subprocess
    import sys
    import time

    engine = ScriptedEngine(tiny_model, lambda ids: "hello")
    for _ in range(8):
        engine.fail_next("delay", seconds=60)  # every model call hangs: the harnesses are mid-rollout
    with serve_in_thread(engine.app) as eng:
        proc = subprocess.Popen(
            [sys.executable, "-m", "openforge.forge_cli.main", "eval", "--tasks", "builtin", "--task", "easy-say-hello",
             "-k", "3", "--engine-url", eng.url, "--model", str(tiny_model)],
            cwd=REPO, env={**os.environ, "FORGE_HOME": str(forge_home)},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 60
        while len(engine.requests) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(engine.requests) == 3, "the three harnesses never called the model"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "eval interrupted; every sandbox was stopped" in out, out
    store = Store(forge_home / "forge.db")
    [run] = store.list_runs()
    assert (run.status, [r.status for r in store.list_rollouts(run.id)]) == ("stopped", ["cancelled"] * 3)
    assert not list((forge_home / "sandboxes").iterdir())
