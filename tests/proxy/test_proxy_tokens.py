"""Tokens: the Hermes tool-call parser and the reuse of sampled ids (no engine needed)."""

from __future__ import annotations


import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from openforge.proxy.calls import Completion, Message, ToolCall
from openforge.proxy.tokens import ChatRenderer, PromptBuilder, parse_completion, ToolCallParser

GOOD = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -l"}}\n</tool_call>'
pieces = st.sampled_from(["hello", " world", "\n", "  ", GOOD, "<tool_call>{oops}</tool_call>", "<tool", "</tool_call>",
                          "é€", '{"name": "x"}', "<tool_call>\n"])


@settings(max_examples=150, deadline=None)
@given(st.lists(pieces, max_size=8), st.lists(st.integers(1, 12), min_size=1, max_size=30))
def test_streamed_parse_equals_one_shot_parse(parts, cuts):
    text = "".join(parts)
    whole = parse_completion(text)
    p, i, events = ToolCallParser(), 0, []
    for n in cuts:
        events += p.feed(text[i:i + n])
        i += n
    events += p.feed(text[i:]) + p.finish()
    assert p.text == whole.text == "".join(e.text for e in events if hasattr(e, "text"))
    assert [(c.name, c.arguments) for c in p.calls] == [(c.name, c.arguments) for c in whole.calls]
    assert p.parse_error == whole.parse_error


def test_parser_cases():
    p = parse_completion("Checking.\n" + GOOD + "\n" + GOOD.replace("ls -l", "pwd"))
    assert p.text == "Checking." and [c.arguments["command"] for c in p.calls] == ["ls -l", "pwd"]
    assert not p.parse_error
    cut = parse_completion('Sure <tool_call>\n{"name": "bash", "argu')  # cut off by max_tokens
    assert cut.calls == [] and cut.parse_error and cut.text == 'Sure <tool_call>\n{"name": "bash", "argu'
    for body in ('{"arguments": {}}', '["bash"]', '{"name": "b", "arguments": 3}', '{"name": ""}'):
        bad = parse_completion(f"<tool_call>{body}</tool_call>")
        assert bad.calls == [] and bad.parse_error, body
    as_string = parse_completion('<tool_call>{"name": "b", "arguments": "{\\"x\\": 1}"}</tool_call>')
    assert as_string.calls[0].arguments == {"x": 1}
    assert parse_completion("plain answer\n").text == "plain answer\n"  # text-only answers are kept exactly


@pytest.fixture(scope="module")
def renderer(tiny_model):
    return ChatRenderer(AutoTokenizer.from_pretrained(str(tiny_model)))


TOOLS = [{"type": "function", "function": {"name": "bash", "description": "", "parameters": {}}}]


def _completion(r: ChatRenderer, text: str, *, eot: bool = True) -> Completion:
    ids = r.encode(text) + ([r.eot_id] if eot else [])
    parsed = parse_completion(text)
    return Completion(parsed.text, parsed.calls, "tool_calls" if parsed.calls else "stop", ids,
                      [-0.5] * len(ids), 0)


def test_renderer_finds_the_end_of_turn_token(renderer):
    assert renderer.eot_text == "<|im_end|>" and renderer.eot_id in renderer.stop_token_ids


def test_replayed_turn_reuses_ids_and_later_turns_extend(renderer):
    b = PromptBuilder(renderer)
    msgs = [Message("user", "go")]
    p0 = b.build("r1", msgs, TOOLS)
    assert p0.ids == renderer.encode(renderer.render(msgs, TOOLS, generation=True)) and p0.reused_tokens == 0
    c0 = _completion(renderer, '<tool_call>\n{"name":"bash","arguments":{"command":"ls"}}\n</tool_call>')
    b.record("r1", msgs, TOOLS, p0, c0, call_id=7)
    # The harness replays it with its own spacing and a new id: still the same turn.
    replay = msgs + [Message("assistant", "", [ToolCall("bash", {"command": "ls"}, id="other")]),
                     Message("tool", "a.txt", tool_call_id="other")]
    p1 = b.build("r1", replay, TOOLS)
    assert p1.ids[:len(p0.ids) + len(c0.completion_ids)] == p0.ids + c0.completion_ids
    assert p1.reused_tokens == len(c0.completion_ids) and p1.extends_call == 7
    assert renderer.tokenizer.decode(p1.ids) == p1.text.replace('{"name": "bash", "arguments": {"command": "ls"}}',
                                                                '{"name":"bash","arguments":{"command":"ls"}}')
    assert b.build("r2", replay, TOOLS).reused_tokens == 0  # another rollout's turns are not used


def test_truncated_turn_gets_its_end_token_as_prompt(renderer):
    b = PromptBuilder(renderer)
    msgs = [Message("user", "go")]
    p0 = b.build("r", msgs, [])
    c0 = _completion(renderer, "partial answ", eot=False)  # finish_reason length: no end-of-turn sampled
    b.record("r", msgs, [], p0, c0)
    p1 = b.build("r", msgs + [Message("assistant", "partial answ"), Message("user", "go on")], [])
    n = len(p0.ids) + len(c0.completion_ids)
    assert p1.ids[:n] == p0.ids + c0.completion_ids and p1.ids[n] == renderer.eot_id


def test_rewritten_history_is_tokenised_fresh(renderer):
    b = PromptBuilder(renderer)
    msgs = [Message("user", "go")]
    p0 = b.build("r", msgs, [])
    b.record("r", msgs, [], p0, _completion(renderer, "first answer"))
    compacted = [Message("system", "summary of earlier work"), Message("assistant", "first answer"),
                 Message("user", "continue")]
    p1 = b.build("r", compacted, [])
    assert p1.reused_tokens == 0 and p1.ids == renderer.encode(renderer.render(compacted, [], generation=True))


def test_memory_is_bounded_by_a_token_budget(renderer):
    b = PromptBuilder(renderer, max_tokens=70)  # each turn here is ~34 ids
    for rollout in ("a", "b", "c"):
        msgs = [Message("user", f"go {rollout}")]
        p = b.build(rollout, msgs, [])
        b.record(rollout, msgs, [], p, _completion(renderer, "an answer of a few tokens"))
    assert b.stored_tokens <= 70 and b.knows("c") and not b.knows("a")  # least recently used dropped first
    assert b.stored_tokens == sum(len(t.ids) for turns in b._turns.values() for t in turns.values())
