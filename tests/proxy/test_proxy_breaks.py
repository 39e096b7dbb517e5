"""proxy/breaks.py: each way a harness breaks its prefix gets its own reason."""

from __future__ import annotations

from openforge.proxy import breaks
from openforge.proxy.breaks import explain_break
from openforge.proxy.calls import Message, ToolCall

SYS = Message("system", "you are an agent")
USER = Message("user", "count the files")
CALL = Message("assistant", "<think>ls first</think>\nlisting", [ToolCall("t1", "bash", '{"command": "ls"}')])
RESULT = Message("tool", "a.txt\nb.txt\nc.txt", tool_call_id="t1", name="bash")
DONE = Message("assistant", "3")
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
PREVIOUS = [SYS, USER, CALL, RESULT, DONE]


def why(messages: list[Message], tools: list = TOOLS) -> str | None:
    return explain_break([(PREVIOUS, TOOLS)], messages, tools)


def test_each_kind_of_break_is_named() -> None:
    stripped = Message("assistant", "listing", CALL.tool_calls)
    assert why([SYS, USER, stripped, RESULT, DONE, Message("user", "more")]) == breaks.THINKING_DROPPED
    cut = Message("tool", "a.txt", tool_call_id="t1", name="bash")
    assert why([SYS, USER, CALL, cut, DONE]) == breaks.TOOL_RESULT_TRUNCATED
    other = Message("tool", "x.txt\ny.txt\nz.txt", tool_call_id="t1", name="bash")
    assert why([SYS, USER, CALL, other]) == breaks.TOOL_RESULT_CHANGED
    assert why([SYS, USER, Message("user", "summary: listed 3 files")]) == breaks.COMPACTED
    assert why([SYS, USER, Message("assistant", "something else"), Message("user", "go"), DONE,
                Message("user", "x")]) == breaks.REWRITTEN
    assert why([Message("system", "new rules"), USER, CALL]) == breaks.SYSTEM_CHANGED
    assert why([SYS, USER, CALL], tools=[]) == breaks.TOOLS_CHANGED
    assert why([SYS, Message("user", "write a title for this chat")]) == breaks.NEW_CONVERSATION
    # Claude Code after an empty answer: the one user turn again, a nudge appended, the answer gone.
    empty = [SYS, USER, Message("assistant", "")]
    nudged = Message("user", USER.content + "\n[Your previous response had no visible output. Please continue.]")
    assert explain_break([(empty, TOOLS)], [SYS, nudged], TOOLS) == breaks.RETRIED
    assert explain_break([(empty, TOOLS)], [SYS, Message("user", "count the dirs")], TOOLS) == breaks.NEW_CONVERSATION


def test_codex_compaction_is_named_at_each_of_its_calls() -> None:
    """The shape Codex 0.171 sends (tests/rollouts/harnesses/test_harness_compaction.py runs the real one): the summary
    request extends the history with its tools withdrawn; the next call replays the first turns + the
    summary (closest to the main conversation, whose tools it has); a second compaction replaces the
    first summary by a longer one, which is not Claude Code's `retried`."""
    ask = Message("user", "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary")
    assert why(PREVIOUS + [ask], tools=[]) == breaks.SUMMARY_ASKED
    summary_call = (PREVIOUS + [ask, Message("assistant", "read 3 files")], [])
    first = Message("user", "Another language model ... produced a summary:\nread 3 files")
    assert explain_break([(PREVIOUS, TOOLS), summary_call], [SYS, USER, first], TOOLS) == breaks.COMPACTED
    after = [SYS, USER, first, CALL, RESULT, DONE]
    second = Message("user", first.content + " and counted them")
    assert explain_break([(after, TOOLS)], [SYS, USER, second], TOOLS) == breaks.COMPACTED
    # Claude Code 2.1 replaces the first user turn by its continuation + the summary.
    continued = Message("user", "This session is being continued from a previous conversation that ran out of context.")
    assert why([SYS, continued, CALL, RESULT]) == breaks.COMPACTED


def test_a_compaction_summary_is_tagged_by_the_harness_turn_never_by_a_tool_result() -> None:
    from openforge.rollouts.harnesses import get_harness
    from openforge.config import HarnessConfig

    side = get_harness(HarnessConfig(name="codex")).side_calls
    dev = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex"}]}
    ask = {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary"}]}
    output = {"type": "function_call_output", "call_id": "c1", "output": ask["content"][0]["text"]}
    assert side.train and side.name_of({"input": [dev, ask], "tools": []}) == "compaction"
    assert side.name_of({"input": [dev, output]}) is None  # the policy's command printed it: not the harness's


def test_a_sub_agent_is_named_by_the_prompt_its_caller_passed() -> None:
    agent = Message("assistant", "", [ToolCall("Agent", {"description": "w", "prompt": "SUBTASK: write proof.txt"})])
    main = ([SYS, USER, agent], TOOLS)
    sub = [Message("system", "You are a sub-agent"), Message("user", "<system-reminder>date</system-reminder>\n\n"
                                                                      "SUBTASK: write proof.txt")]
    assert explain_break([main], sub, TOOLS) == breaks.SUB_AGENT
    assert explain_break([main], [SYS, Message("user", "write a title")], TOOLS) == breaks.NEW_CONVERSATION


def test_an_extension_message_for_message_is_no_harness_break() -> None:
    assert why(PREVIOUS + [Message("user", "thanks")]) is None
    assert explain_break([], [SYS, USER], TOOLS) is None


def test_the_closest_recent_call_explains_it() -> None:
    side = ([SYS, Message("user", "write a title"), Message("assistant", "Files")], TOOLS)
    # The main conversation's next call, after a side request: explained against the main one.
    cut = Message("tool", "a.txt", tool_call_id="t1", name="bash")
    assert explain_break([(PREVIOUS, TOOLS), side], [SYS, USER, CALL, cut], TOOLS) == breaks.TOOL_RESULT_TRUNCATED

