"""rollouts/tasks/gsm8k/kind.py's own pieces: the `#### N` final number, one line as a task, a file's refusals."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from openforge.rollouts.tasks.gsm8k.kind import ASK, convert, final_number, import_gsm8k


def test_the_final_number_is_the_last_line_exactly() -> None:
    assert final_number("48/2 = 24\n#### 72\n") == Decimal(72)
    assert final_number("#### 1,600") == Decimal(1600) and final_number("#### -0.5") == Decimal("-0.5")
    for bad, why in [("#### 72 clips", "no final"), ("#### 1,60", "no final"), ("72", "no final"),
                     (f"#### {2 ** 53}", "cannot be checked exactly")]:
        with pytest.raises(ValueError, match=why):
            final_number(bad)


def test_a_line_becomes_an_exact_number_task_whose_reasoning_is_never_shown() -> None:
    task = convert({"question": " Half of 8? ", "answer": "8/2 = <<8/2=4>>4\n#### 4"}, "gsm8k-00007")
    assert task["instruction"] == f"Half of 8?\n\n{ASK}" and "<<" not in task["instruction"]
    assert task["expect_answer"] == {"number": 4.0} and task["tags"] == ["gsm8k"]
    assert task["solution"].endswith("printf '%s\\n' 4 > .forge/answer.txt")


def test_a_file_imports_what_it_can_and_names_each_refused_line(tmp_path: Path) -> None:
    src = tmp_path / "test.jsonl"
    src.write_text('{"question": "1+1?", "answer": "#### 2"}\n\n[1]\n{"question": "", "answer": "#### 3"}\n{bad\n')
    tasks, refused = import_gsm8k(src)
    assert [t["id"] for t in tasks] == ["gsm8k-00001"]  # the id is the line number
    assert [(where.rsplit(":", 1)[1], why.split(":")[0]) for where, why in refused] == [
        ("3", "a JSON list, not an object"), ("4", "question"), ("5", "bad JSON")]
