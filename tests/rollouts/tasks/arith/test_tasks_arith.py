"""The generated arith family (rollouts/tasks/arith/): seeded, disjoint splits, exact grades, hidden from sandboxes."""

from __future__ import annotations

import re
from pathlib import Path

from openforge.rollouts.tasks.arith.generate import SPLITS, write
from openforge.rollouts.tasks.format import ARITH_DIR, load_tasks
from openforge.rollouts.tasks.grading import answer_matches
from openforge.sandbox.local import hidden_paths

QUESTION = re.compile(r"What is (\d+) \+ (\d+)\?")


def test_the_shipped_files_are_the_generators_output(tmp_path: Path) -> None:
    assert write(out=tmp_path) == SPLITS
    for split in SPLITS:  # edited by the generator only: same seed, same bytes
        assert (tmp_path / f"{split}.jsonl").read_bytes() == (ARITH_DIR / f"{split}.jsonl").read_bytes()


def test_the_splits_are_disjoint_and_every_grade_is_exact() -> None:
    seen: dict[tuple[str, str], str] = {}
    for split, n in SPLITS.items():
        tasks = load_tasks(f"arith-{split}")
        assert len(tasks) == n
        for task in tasks:
            equation = task.expect_answer.text
            a, b = (task.files["numbers.txt"].split() if task.files else QUESTION.match(task.instruction).groups())
            assert equation == f"{a} + {b} = {int(a) + int(b)}"
            assert (a, b) not in seen, f"{task.id} asks what {seen.get((a, b))} asks"
            seen[(a, b)] = task.id
            assert answer_matches(task.expect_answer, equation) and answer_matches(task.expect_answer, equation + ".")
            for wrong in (f"{int(a) + int(b)}", f"{a} + {b} equals {int(a) + int(b)}", f"{a} + {b} = {int(a) + int(b) + 1}",
                          f"The answer: {equation}", f"{equation}\n{equation}"):
                assert not answer_matches(task.expect_answer, wrong), (task.id, wrong)
    assert len(seen) == sum(SPLITS.values())


def test_the_family_with_its_answers_is_hidden_from_every_sandbox() -> None:
    assert str(ARITH_DIR.resolve()) in hidden_paths()
