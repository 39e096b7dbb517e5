"""Every built-in task is solvable and cannot be fooled: through the real runner and local sandboxes,
each reference solution scores exactly 1 and each hostile answer (empty, digits, the alphabet, an
error blob, the instruction echoed, 1 MB of text) scores exactly 0; so do the known grader hacks."""

from __future__ import annotations

import base64
import textwrap

import pytest

from openforge.config import ForgeConfig
from openforge.store import Store
from openforge.rollouts.tasks.grading import ExpectedAnswer, answer_matches, normalise_answer
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.selfcheck import HOSTILE_ANSWERS, _StandInHarness, check_solutions
from openforge.rollouts.tasks.format import load_tasks

TASKS = load_tasks("builtin")
BY_ID = {t.id: t for t in TASKS}


def test_builtin_set_is_graded_and_large_enough() -> None:
    levels = {t.difficulty for t in TASKS}
    assert len(TASKS) >= 30 and levels == {"easy", "medium", "hard"}
    assert all(t.solution for t in TASKS)
    answer_tasks = [t for t in TASKS if "answer" in t.tags]
    assert answer_tasks and all(t.expect_answer is not None and t.verifier is None for t in answer_tasks)


@pytest.mark.slow
async def test_solutions_score_one_and_hostile_answers_zero(store: Store) -> None:
    problems = await check_solutions(store, ForgeConfig(), TASKS)
    assert problems == []
    [run] = [r for r in store.list_runs() if r.kind == "check"]
    rollouts = store.list_rollouts(run.id)
    assert len(rollouts) == len(TASKS) * (1 + len(HOSTILE_ANSWERS))
    solved = {r.task_id: r.reward for r in rollouts if r.step == 0}
    assert solved == {t.id: 1.0 for t in TASKS}  # exactly 1, not merely a pass
    hostile = [(r.task_id, r.step, r.reward) for r in rollouts if r.step > 0 and r.reward != 0.0]
    assert hostile == []
    assert all(r.status == "scored" for r in rollouts)


# An agent that knows how the graders work, and tries to pass without doing the task.
HACKS = {
    # a json module beside the verifier that approves anything
    "med-edit-json": "printf 'def load(f):\\n    return {\"name\": \"app\", \"port\": 9090, \"debug\": True}\\n' > json.py",
    # code the verifier runs prints a perfect score, in-process and then out of band, and exits 0
    "hard-fix-calc": "printf 'import sys\\nprint(\"score: 1.000\")\\nsys.stdout.flush()\\nimport os\\nos._exit(0)\\n' > calc.py",
    # the program prints the expected line for the verifier, whatever it is asked, then a score
    "med-fix-add": "printf 'print(5)\\nprint(\"score: 1\")\\n' > add.py",
    # a grader module planted where the verifier's helper would import it from
    "hard-palindrome": "mkdir -p .verify && printf 'raise SystemExit(0)\\n' > .verify/subprocess.py && "
                       "printf 'def is_palindrome(s):\\n    return True\\n' > pal.py",
    # the expected file as a link to something the agent controls is still only what it holds
    "med-sort-names": "ln -s names.txt sorted.txt",
    # the program the verifier runs prints whatever expected output the verifier's files hold
    "hard-fizzbuzz": "echo " + base64.b64encode(textwrap.dedent("""
        import glob, sys
        for f in sorted(glob.glob('.verify/*')):
            t = open(f).read()
            if f.endswith('want.txt'):
                sys.stdout.write(t)
                break
            i = t.find("'1\\n2\\nFizz")
            if i >= 0:
                sys.stdout.write(eval(t[i:t.index("'", i + 1) + 1]))
                break
        """).encode()).decode() + " | base64 -d > fizzbuzz.py",
}


async def test_known_grader_hacks_score_zero(store: Store) -> None:
    run = store.create_run(kind="check")
    runner = RolloutRunner(store, config=ForgeConfig(), proxy_url="http://127.0.0.1:9",
                           harness=_StandInHarness(HACKS))
    out = await runner.run(run.id, [RolloutSpec(BY_ID[tid]) for tid in HACKS])
    assert {ro.task_id: (ro.status, ro.reward) for ro in out} == {tid: ("scored", 0.0) for tid in HACKS}


@pytest.mark.parametrize(("expect", "answer", "ok"), [
    ({"number": 5}, "5", True),
    ({"number": 5}, " 5.\n", True),
    ({"number": 5}, "**5**", True),
    ({"number": 5}, "5.0", True),
    ({"number": 5}, "`+5`", True),
    ({"number": 5}, "The answer is 5", False),
    ({"number": 5}, "55", False),
    ({"number": 5}, "5 5", False),
    ({"number": 5}, "0123456789", False),
    ({"number": 5}, "5" + " " * 3000, True),  # whitespace is not the answer...
    ({"number": 5}, "5" * 3000, False),  # ...but a long answer is wrong without being read
    ({"words": "hello world"}, "Hello, world!", True),
    ({"words": "hello world"}, "hello world hello world", False),
    ({"words": "hello world"}, "world hello", False),
    ({"words": "hello world"}, "Answer with the two words: hello world", False),
    ({"words": "bash read_file write_file"}, "bash, read_file, write_file", True),
    ({"text": "OK"}, "'OK'", True),
    ({"text": "OK"}, "ok", False),
])
def test_answers_are_compared_exactly_after_normalising(expect: dict, answer: str, ok: bool) -> None:
    assert answer_matches(ExpectedAnswer(**expect), answer) is ok


def test_normalising_strips_one_wrapper_and_one_period() -> None:
    assert normalise_answer('  "yes."  ') == "yes"
    assert normalise_answer("...") == "..."
    with pytest.raises(ValueError, match="exactly one"):
        ExpectedAnswer(number=1, words="one")


async def test_hard_fix_calc_gives_half_credit_per_function_fixed(store: Store) -> None:
    run = store.create_run(kind="check")
    task = BY_ID["hard-fix-calc"]
    fixes = {"add only": "sed -i '2s/a - b/a + b/' calc.py", "both": task.solution or "",
             "div broken": task.solution + " && sed -i 's/a \\/ b/a - b/' calc.py"}
    got = {}
    for label, script in fixes.items():
        runner = RolloutRunner(store, config=ForgeConfig(), proxy_url="http://127.0.0.1:9",
                               harness=_StandInHarness({task.id: script}))
        [ro] = await runner.run(run.id, [RolloutSpec(task)])
        got[label] = ro.reward
    assert got == {"add only": 0.5, "both": 1.0, "div broken": 0.0}
