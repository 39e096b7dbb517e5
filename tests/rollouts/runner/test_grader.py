"""rollouts/runner/grader.py: the exact graders after the agent is gone. Every expectation must hold for the
verifier's score to count, and the grader's files are written afresh where the agent may have planted its own.
(Whole rollouts graded through the runner are tests/rollouts/runner/test_runner.py's.)"""

from __future__ import annotations

from openforge.config import ForgeConfig, LocalSandboxConfig
from openforge.rollouts.runner.grader import RolloutGrader, tail
from openforge.rollouts.tasks.format import ANSWER_FILE, TaskSpec
from openforge.sandbox import make_sandbox
from openforge.store import Store

# The verifier reads the answer file the grader wrote: a planted one would say "forged".
TASK = TaskSpec(id="t", instruction="write hi to out.txt and answer 42", expect_answer={"number": 42},
                expect_files={"out.txt": "hi\n"}, verifier=f'test "$(cat {ANSWER_FILE})" = 42 && echo "score: 0.5"')


async def test_every_expectation_must_hold_and_the_answer_file_is_the_graders(store: Store) -> None:
    grader = RolloutGrader(store, ForgeConfig())
    async with make_sandbox(LocalSandboxConfig(isolation="none"), run_id="run-g", rollout_id="ro-g") as sb:
        await sb.write_file("out.txt", b"hi\n")
        await sb.write_file(ANSWER_FILE, b"forged")  # planted by the agent where the grader writes
        reward, said, note = await grader.grade_checks(sb, TASK, "42")
        assert (reward, note) == (0.5, None), said
        assert "answer: ok" in said and "out.txt: ok" in said and "verifier: exit code 0" in said
        reward, said, _ = await grader.grade_checks(sb, TASK, "41")  # the verifier's score needs every check
        assert reward == 0.0 and "answer: wrong: expected" in said
        await sb.write_file("out.txt", b"bye\n")
        reward, said, _ = await grader.grade_checks(sb, TASK, "42")
        assert reward == 0.0 and "out.txt: wrong: got 'bye\\n'" in said


def test_stored_output_keeps_its_tail_where_the_errors_are() -> None:
    assert tail("short") == "short"
    assert tail("x" * 10 + "the error", limit=9) == "[... 10 characters cut ...]\nthe error"
