"""`forge tasks validate|list` through the real CLI app."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from forge_cli.main import app


def test_validate_builtin_and_list() -> None:
    out = CliRunner().invoke(app, ["tasks", "validate", "builtin"])
    assert out.exit_code == 0 and "30 task(s) ok (easy 10, hard 8, medium 12)" in out.output
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
