"""Task format: loading every layout, reporting every bad task, and reading a verifier's score."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from openforge.errors import TaskError
from openforge.rollouts.tasks.format import load_tasks, parse_score, validate_tasks

GOOD = {"id": "t1", "instruction": "do it", "verifier": "true"}


def _jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_validate_reports_every_bad_task_with_its_reason(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "set.jsonl", [
        json.dumps(GOOD),
        json.dumps({"id": "t2", "instruction": "no verifier"}),
        "{not json",
        json.dumps(GOOD),  # duplicate id
        json.dumps({**GOOD, "id": "t3", "pass_threshold": 1.5}),
        json.dumps({**GOOD, "id": "t4", "time_limit_s": -1}),
        json.dumps({**GOOD, "id": "t5", "files": {"../escape.txt": "x"}}),
        json.dumps({**GOOD, "id": "bad id!"}),
        json.dumps({**GOOD, "id": "t6", "verifer": "typo"}),
        "[1, 2]",
        json.dumps({**GOOD, "id": "t7", "verifier": "   "}),
    ])
    problems = validate_tasks(path)
    text = [str(p) for p in problems]
    expect = [
        (":2 [t2]", "verifier: missing"),
        (":3", "bad JSON line 3"),
        (":4 [t1]", "duplicate id (first defined at"),
        (":5 [t3]", "pass_threshold: Input should be less than or equal to 1"),
        (":6 [t4]", "time_limit_s: Input should be greater than 0"),
        (":7 [t5]", "must be relative and stay inside"),
        (":8 [bad id!]", "id: must be 1-128 of letters"),
        (":9 [t6]", "verifer: unknown field"),
        (":10", "is a JSON list, not an object"),
        (":11 [t7]", "verifier: must not be blank"),
    ]
    assert len(problems) == len(expect), text
    for (where, msg), line in zip(expect, text):
        assert where in line and msg in line, (where, msg, line)
    with pytest.raises(TaskError, match="10 problem"):
        load_tasks(path)


@pytest.mark.parametrize("key", ["files", "verifier_files", "expect_files"])
def test_validate_rejects_a_file_path_with_a_nul_byte(tmp_path: Path, key: str) -> None:
    # Such a path once passed validation and crashed the rollout with a traceback when the sandbox wrote it.
    path = _jsonl(tmp_path / "set.jsonl", [json.dumps({**GOOD, key: {"a\u0000b.txt": "x"}})])
    [problem] = validate_tasks(path)
    assert "[t1]" in str(problem) and f"{key}: " in str(problem) and "contains a NUL byte" in str(problem)
    with pytest.raises(TaskError, match="NUL byte"):
        load_tasks(path)


def test_folder_with_jsonl_json_toml_and_task_folders(tmp_path: Path) -> None:
    tmp_path = tmp_path / "set"
    tmp_path.mkdir()
    _jsonl(tmp_path / "a.jsonl", [json.dumps(GOOD)])
    (tmp_path / "b.json").write_text(json.dumps({**GOOD, "id": "t2"}))
    (tmp_path / "c.toml").write_text('id = "t3"\ninstruction = "x"\nverifier = "true"\ndifficulty = "hard"\n')
    folder = tmp_path / "fix-it"
    (folder / "files" / "src").mkdir(parents=True)
    (folder / "verifier").mkdir()
    (folder / "task.toml").write_text('instruction = "fix"\nverifier = "sh .check.sh"\ntags = ["py"]\n')
    (folder / "files" / "src" / "main.py").write_text("print(1)\n")
    (folder / "verifier" / ".check.sh").write_text("exit 0\n")
    (tmp_path / "__pycache__").mkdir()  # ignored, like hidden files
    tasks = {t.id: t for t in load_tasks(tmp_path)}
    assert sorted(tasks) == ["fix-it", "t1", "t2", "t3"]
    assert tasks["fix-it"].files == {"src/main.py": "print(1)\n"}
    assert tasks["fix-it"].verifier_files == {".check.sh": "exit 0\n"}
    assert tasks["t3"].difficulty == "hard"
    assert [t.id for t in load_tasks(tmp_path, include=["t2"])] == ["t2"]
    with pytest.raises(TaskError, match="no task"):
        load_tasks(tmp_path, include=["nope"])


def test_missing_path_empty_folder_and_folder_without_spec(tmp_path: Path) -> None:
    tmp_path = tmp_path / "set"
    tmp_path.mkdir()
    assert "no such task file" in str(validate_tasks(tmp_path / "nope.jsonl")[0])
    assert "holds no tasks" in str(validate_tasks(tmp_path)[0])
    (tmp_path / "t").mkdir()
    assert "no task.json or task.toml" in str(validate_tasks(tmp_path)[0])
    (tmp_path / "x.txt").write_text("")
    assert "must end in .jsonl" in str(validate_tasks(tmp_path / "x.txt")[0])


@pytest.mark.parametrize(("exit_code", "stdout", "reward", "problem"), [
    (0, "", 1.0, None),
    (1, "", 0.0, None),
    (0, "checking...\nscore: 0.25\n", 0.25, None),
    (1, "score: 0.75\n\n", 0.0, None),  # a failing verifier gives 0, whatever its (agent's) code printed
    (0, "0.5", 0.5, None),
    (0, "SCORE = 1", 1.0, None),
    (0, "score: 1e-1", 0.1, None),
    (0, "score: 1.5", 0.0, "outside [0, 1]"),
    (0, "score: -0.1", 0.0, "outside [0, 1]"),
    (0, "score: nan", 0.0, "outside [0, 1]"),
    (0, "score: lots", 0.0, "unreadable score"),
    (0, "all good, 3 tests", 1.0, None),  # a last line that is not a score: the exit code decides
    (2, "42", 0.0, None),
])
def test_parse_score(exit_code: int, stdout: str, reward: float, problem: str | None) -> None:
    got, why = parse_score(exit_code, stdout)
    assert got == pytest.approx(reward)
    assert (why is None) if problem is None else (problem in why)
