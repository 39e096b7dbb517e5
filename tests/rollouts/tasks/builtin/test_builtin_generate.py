"""rollouts/tasks/builtin/generate.py writes the shipped builtin task set: the files in the package are exactly
what it writes (never edited by hand), and its helpers build the answers the runner reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from openforge.rollouts.tasks.builtin import generate


def test_the_shipped_task_files_are_the_generators_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = Path(generate.__file__).parent
    monkeypatch.setattr(generate, "HERE", tmp_path)
    generate.main()
    for name in ("easy.jsonl", "medium.jsonl", "hard.jsonl"):
        assert (tmp_path / name).read_text() == (shipped / name).read_text(), \
            f"{name} differs from the generator's: run python rollouts/tasks/builtin/generate.py"


def test_a_demo_digit_task_wants_its_digit() -> None:
    task = generate.demo_digit_task(8)
    assert task["expect_answer"] == {"number": 8} and task["id"] == "demo-digit-8"
    assert task["instruction"].count(" 8") >= generate.DEMO_LINE_LENGTH - 1 and "3 or 8" in task["instruction"]
    assert task["solution"] == "mkdir -p .forge && printf '%s\\n' '8' > .forge/answer.txt"
