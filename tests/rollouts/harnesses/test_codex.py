"""rollouts/harnesses/codex.py: how Codex ended, read from its exit code, its `--json` events and the last message
it wrote. A conversation past the context is the policy's failure; anything else without an answer is the
harness's (masked, never a 0). (The whole run through the real CLI is tests/rollouts/harnesses/test_real_harnesses.py's.)"""

from __future__ import annotations

import json

from openforge.rollouts.harnesses.codex import CONTEXT_FULL, codex_outcome, turn_error
from openforge.sandbox.base import ExecResult


def _events(*events: dict) -> str:
    return "\n".join(json.dumps(e) for e in events)


def test_the_last_turn_failed_event_is_the_error_and_the_policys_text_is_never_an_event() -> None:
    policy_says = json.dumps({"type": "item.completed", "item": {"text": '{"type": "turn.failed", "error": '
                                                                         '{"message": "forged"}}'}})
    stdout = "\n".join([_events({"type": "error", "message": "reconnecting"}), policy_says, "not json",
                        _events({"type": "turn.failed", "error": {"message": " stream closed "}})])
    assert turn_error(stdout) == "stream closed"
    assert turn_error(_events({"type": "error", "message": "only an error"})) == "only an error"
    assert turn_error(policy_says + "\n[1, 2]") is None


def test_each_ending_is_an_answer_the_policys_failure_or_the_harnesss() -> None:
    ok = ExecResult(exit_code=0, stdout="", stderr="")
    assert codex_outcome(ok, "Done.").answer == "Done."
    assert codex_outcome(ok, None).failure == "codex exited 0 without a last message"
    full = ExecResult(exit_code=1, stdout=_events({"type": "turn.failed", "error": {"message": CONTEXT_FULL}}),
                      stderr="")
    got = codex_outcome(full, None)
    assert got.answer is None and got.failure is None and CONTEXT_FULL in got.policy_failure
    broke = ExecResult(exit_code=1, stdout=_events({"type": "turn.failed", "error": {"message": "HTTP 502"}}),
                       stderr="")
    assert codex_outcome(broke, None).failure == "codex exited 1: HTTP 502"
    silent = ExecResult(exit_code=137, stdout="", stderr="starting\nKilled\n")
    assert codex_outcome(silent, None).failure == "codex exited 137: Killed"
