"""rollouts/runner/transcript.py: a rollout's recorded calls read back as what the agent did: tool uses from the
proxy's parse, their results matched by id in each API's own field, the final answer, and the one-line actions a
judge reads."""

from __future__ import annotations

from openforge.rollouts.runner.transcript import action_history, shell_command, tool_failed, tool_results, \
    transcript_of
from openforge.store import Call

BASH = {"type": "function", "function": {"name": "bash", "parameters": {}}}


def _call(seq: int, request: dict, *, tool_calls: list | None = None, response: dict | None = None,
          status: str = "ok") -> Call:
    return Call(run_id="r", rollout_id="ro", seq=seq, status=status, request_json=request,
                tool_calls_json=tool_calls or [], response_json=response, prompt_tokens=10 + seq, completion_tokens=seq)


def test_results_are_matched_to_their_use_in_each_apis_own_field() -> None:
    assert tool_results({"messages": [{"role": "tool", "tool_call_id": "c1", "content": "a.txt"}]}) == \
        {"c1": ("a.txt", False)}
    assert tool_results({"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "u1", "content": [{"type": "text", "text": "denied"}], "is_error": True},
    ]}]}) == {"u1": ("denied", True)}
    assert tool_results({"input": [{"type": "function_call_output", "call_id": "f1",
                                    "output": "Process exited with code 2"}]}) == {"f1": ("Process exited with code 2", True)}


def test_a_failure_is_read_in_the_harnesses_own_words_not_any_mention_of_an_error() -> None:
    assert tool_failed("error: no such file") and tool_failed("bash: foo: command not found")
    assert tool_failed("Traceback (most recent call last):\n  File ...")
    assert not tool_failed("grep found 3 lines mentioning error handling") and not tool_failed("exit code 0")


def test_a_rollouts_calls_read_back_as_its_steps_and_answer() -> None:
    first = _call(0, {"messages": [{"role": "user", "content": "count"}], "tools": [BASH]},
                  tool_calls=[{"id": "c1", "name": "bash", "arguments": {"command": "ls | wc -l"}}])
    second = _call(1, {"messages": [{"role": "tool", "tool_call_id": "c1", "content": "exit code 1"}]},
                   response={"choices": [{"message": {"content": "3 files"}}]})
    lost = _call(2, {"messages": []}, status="error")
    t = transcript_of([lost, second, first])  # any order
    assert (t.turns, t.tools_offered, t.final_text) == (2, ["bash"], "3 files")
    [step] = t.steps
    assert (step.call_seq, step.name, step.result, step.failed) == (0, "bash", "exit code 1", True)
    assert shell_command(step) == "ls | wc -l"
    assert t.prompt_tokens == [10, 11] and t.completion_tokens == [0, 1]
    assert action_history([second, first], max_line=20) == ['bash({"command": "ls', "3 files"]
