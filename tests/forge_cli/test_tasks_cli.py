"""`forge tasks validate|list` through the real CLI app."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from openforge.forge_cli.main import app


def test_validate_builtin_and_list() -> None:
    out = CliRunner().invoke(app, ["tasks", "validate", "builtin"])
    assert out.exit_code == 0 and "32 task(s) ok (easy 12, hard 8, medium 12)" in out.output
    out = CliRunner().invoke(app, ["tasks", "list", "builtin"])
    assert out.exit_code == 0 and "easy-say-hello" in out.output and "hard-dedupe" in out.output


def test_validate_prints_every_problem_and_fails_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([json.dumps({"id": "a", "instruction": "x"}), "{oops",
                               json.dumps({"id": "b", "instruction": "x", "verifier": "true", "time_limit_s": 0})]))
    out = CliRunner().invoke(app, ["tasks", "validate", str(path)])
    assert out.exit_code == 1
    lines = out.output.strip().splitlines()
    assert "bad.jsonl:1 [a]: verifier: missing" in lines[0]
    assert "bad JSON line 2" in lines[1] and "time_limit_s" in lines[2]
    assert lines[-1] == f"forge: error: 3 problem(s) in {path}"
    assert "Traceback" not in out.output
    out = CliRunner().invoke(app, ["tasks", "list", str(tmp_path / "missing")])
    assert out.exit_code == 1 and "no such task file or folder" in out.output


def test_validate_run_proves_every_builtin_verifier_in_real_sandboxes(forge_home: Path) -> None:
    out = CliRunner().invoke(app, ["tasks", "validate", "builtin", "--run"])
    assert out.exit_code == 0, out.output
    assert "32 task(s) ok (easy 12, hard 8, medium 12, solutions checked)" in out.output
    assert not list((forge_home / "sandboxes").iterdir())


def test_validate_run_reports_verifiers_that_cannot_tell(tmp_path: Path) -> None:
    path = tmp_path / "set.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in [
        {"id": "good", "instruction": "a", "verifier": "test -f x", "solution": "touch x"},
        {"id": "lenient", "instruction": "b", "verifier": "true", "solution": "true"},
        {"id": "wrong", "instruction": "c", "verifier": "echo 'score: 0.4'", "solution": "true", "pass_threshold": 0.5},
        {"id": "unchecked", "instruction": "d", "verifier": "test -f y"},
    ]))
    out = CliRunner().invoke(app, ["tasks", "validate", str(path), "--run"])
    assert out.exit_code == 1
    lines = out.output.strip().splitlines()
    assert lines[:-1] == [
        "no reference to check: 1 task(s) (unchecked): the hostile answers and an idle agent ran on them",
        "solution check [wrong]: the reference solution scores 0.4 < pass_threshold 0.5: score: 0.4",
        "solution check [lenient]: gives credit to hostile answers (must be 0): empty 1, digits 1, alphabet 1, "
        "error blob 1, instruction echoed 1, 1 MB of text 1",
        "solution check [wrong]: gives credit to hostile answers (must be 0): empty 0.4, digits 0.4, alphabet 0.4, "
        "error blob 0.4, instruction echoed 0.4, 1 MB of text 0.4",
    ], lines
    assert lines[-1] == f"forge: error: 2 task(s) of {path} failed the solution check"


def test_validate_run_without_references_runs_the_hostile_answers_and_an_idle_agent(tmp_path: Path,
                                                                                   forge_home: Path) -> None:
    """Issue 44: a set with no runnable reference ran no rollout, said every task "failed the solution
    check" and exited 1. It says there is no reference to check, still runs the hostile answers and an idle
    agent, and exits 0 when all of those score 0; a grader that credits the idle agent is named."""
    from openforge.store import Store

    path = tmp_path / "set.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in [
        {"id": "strict", "instruction": "a", "verifier": "test -f y"},
        {"id": "idle-passes", "instruction": "b", "verifier": "test ! -f y"}]))
    path_ok = tmp_path / "ok.jsonl"
    path_ok.write_text(path.read_text().splitlines()[0] + "\n")
    out = CliRunner().invoke(app, ["tasks", "validate", str(path_ok), "--run"])
    assert out.exit_code == 0, out.output
    assert "no reference to check: 1 task(s) (strict): the hostile answers and an idle agent ran on them" in out.output
    (run,) = [r for r in Store(forge_home / "forge.db").list_runs() if r.name == "tasks validate --run"]
    rollouts = Store(forge_home / "forge.db").list_rollouts(run.id)
    assert len(rollouts) == 6 + 1 and {(r.status, r.reward) for r in rollouts} == {("scored", 0.0)}
    out = CliRunner().invoke(app, ["tasks", "validate", str(path), "--run"])
    assert out.exit_code == 1
    assert ("solution check [idle-passes]: gives credit to hostile answers (must be 0): idle agent 1, empty 1, "
            "digits 1") in out.output
