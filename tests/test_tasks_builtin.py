"""Every built-in task is solvable (its reference solution passes) and not free (doing nothing fails).

Runs setup, solution and verifier with `sh` in a temp dir: the same commands the runner sends to a
sandbox, without the sandbox (its own tests cover it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rollouts.tasks import TaskSpec, load_tasks, parse_score

TASKS = load_tasks("builtin")


def _reward(task: TaskSpec, workdir: Path, *, solve: bool) -> float:
    for rel, content in task.files.items():
        (workdir / rel).parent.mkdir(parents=True, exist_ok=True)
        (workdir / rel).write_text(content)
    steps = [task.setup] if task.setup else []
    if solve:
        steps.append(task.solution)
    for cmd in steps:
        subprocess.run(["sh", "-c", cmd], cwd=workdir, check=True, timeout=20, capture_output=True)
    for rel, content in task.verifier_files.items():
        (workdir / rel).parent.mkdir(parents=True, exist_ok=True)
        (workdir / rel).write_text(content)
    done = subprocess.run(["sh", "-c", task.verifier], cwd=workdir, timeout=20, capture_output=True, text=True)
    reward, problem = parse_score(done.returncode, done.stdout)
    assert problem is None, (task.id, done.stdout, done.stderr)
    return reward


def test_builtin_set_is_graded_and_large_enough() -> None:
    levels = {t.difficulty for t in TASKS}
    assert len(TASKS) >= 30 and levels == {"easy", "medium", "hard"}
    assert all(t.solution for t in TASKS)


@pytest.mark.parametrize("task", TASKS, ids=[t.id for t in TASKS])
def test_builtin_task_solution_passes_and_nothing_fails(task: TaskSpec, tmp_path: Path) -> None:
    solved, empty = tmp_path / "solved", tmp_path / "empty"
    solved.mkdir()
    empty.mkdir()
    assert _reward(task, solved, solve=True) >= task.pass_threshold
    assert _reward(task, empty, solve=False) < task.pass_threshold


def test_easy_tasks_give_partial_credit_for_a_wrong_answer(tmp_path: Path) -> None:
    # The demo trains a random model: a non-empty wrong answer must score between 0 and a pass.
    task = next(t for t in TASKS if t.id == "easy-say-hello")
    (tmp_path / ".forge").mkdir()
    (tmp_path / ".forge/answer.txt").write_text("hello there\n")
    done = subprocess.run(["sh", "-c", task.verifier], cwd=tmp_path, capture_output=True, text=True)
    assert parse_score(done.returncode, done.stdout) == (pytest.approx(0.6), None)
    (tmp_path / ".forge/answer.txt").write_text("zzz\n")
    done = subprocess.run(["sh", "-c", task.verifier], cwd=tmp_path, capture_output=True, text=True)
    assert parse_score(done.returncode, done.stdout) == (pytest.approx(0.2), None)
