"""The proxy's output parsers (proxy/toolcalls.py, proxy/reasoning.py, proxy/parsing.py), no engine:
each format, streaming == one-shot in any chunking, strict mode, tool_choice, `auto` from templates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.paths import REPO
from openforge.proxy.calls import ReasoningDelta, TextDelta, ToolCallDelta, ToolCallEvent, ToolCallStart
from openforge.proxy.parsing import OutputParser, ParserSetup, UnknownParser, parse_output
from openforge.proxy.reasoning import ReasoningParser, resolve_reasoning_parser
from openforge.proxy.toolcalls import CallRules, parse_tool_calls, resolve_tool_parser

TEMPLATES = REPO / "engine" / "templates"
SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"},
                                           "ratio": {"type": "number"}, "force": {"type": "boolean"},
                                           "env": {"type": "object"}, "paths": {"type": "array"}}}
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "", "parameters": SCHEMA}}]

HERMES = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la", "timeout": 5}}\n</tool_call>'
CODER = ("<tool_call>\n<function=bash>\n<parameter=command>\nls -la\n</parameter>\n<parameter=timeout>\n5\n"
         "</parameter>\n</function>\n</tool_call>")


def run(parser: OutputParser, text: str, cuts: list[int]) -> list:
    events, i = [], 0
    for n in cuts:
        events += parser.feed(text[i:i + n])
        i += n
    return events + parser.feed(text[i:]) + parser.finish()


def check_stream(events: list, parser: OutputParser) -> None:
    """Events tell the same story as the final parse: text, thinking, and per call start -> deltas -> end,
    the deltas joined being exactly the call's arguments JSON."""
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == parser.text
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == parser.reasoning
    starts = {e.index: e for e in events if isinstance(e, ToolCallStart)}
    ends = [e for e in events if isinstance(e, ToolCallEvent)]
    assert sorted(starts) == sorted(e.index for e in ends)
    good = [e for e in ends if not e.malformed]
    assert [e.call for e in good] == parser.calls
    for e in good:
        assert starts[e.index].name == e.call.name and starts[e.index].id == e.call.id
        args = "".join(d.arguments for d in events if isinstance(d, ToolCallDelta) and d.index == e.index)
        assert args == e.call.arguments_json and json.loads(args) == e.call.arguments
    for k, e in enumerate(events):  # a call's deltas lie between its start and its end
        if isinstance(e, ToolCallDelta):
            assert any(isinstance(s, ToolCallStart) and s.index == e.index for s in events[:k])
            assert not any(isinstance(s, ToolCallEvent) and s.index == e.index for s in events[:k])


def snapshot(p: OutputParser) -> tuple:
    return p.text, p.reasoning, [(c.name, c.arguments, c.raw_arguments) for c in p.calls], p.parse_error


pieces = st.sampled_from([
    "hello", " world", "\n", "  ", HERMES, CODER, "<tool_call>{oops}</tool_call>", "<tool", "</tool_call>", "é€",
    '{"name": "x"}', "<tool_call>\n", "<think>", "</think>", "\nI think.\n", "<function=bash>",
    "<parameter=command>\npwd\n</parameter>", "</function>", '<tool_call>{"name": "bash", "arguments": {"command": "a}"',
])


@settings(max_examples=200, deadline=None)
@given(st.lists(pieces, max_size=8), st.lists(st.integers(1, 12), min_size=1, max_size=30),
       st.sampled_from(["hermes", "qwen25", "qwen3_coder"]), st.sampled_from(["none", "qwen3", "deepseek_r1"]),
       st.booleans())
def test_any_chunking_gives_the_one_shot_parse(parts, cuts, tool_parser, reasoning_parser, strict):
    text = "".join(parts)
    setup = ParserSetup(tool_parser, reasoning_parser, strict)
    whole = parse_output(text, setup, tools=TOOLS)
    streamed = OutputParser(setup, tools=TOOLS)
    events = run(streamed, text, cuts)
    assert snapshot(streamed)[:2] == snapshot(whole)[:2]
    assert [(c.name, c.arguments) for c in streamed.calls] == [(c.name, c.arguments) for c in whole.calls]
    assert streamed.parse_error == whole.parse_error
    check_stream(events, streamed)


def test_qwen3_coder_calls_and_schema_types():
    text = ("I'll check.\n\n<tool_call>\n<function=bash>\n<parameter=command>\necho 'a\nb' > f.txt\n</parameter>\n"
            "<parameter=timeout>\n30\n</parameter>\n<parameter=ratio>\n2\n</parameter>\n<parameter=force>\nTrue\n"
            "</parameter>\n<parameter=env>\n{\"A\": 1}\n</parameter>\n<parameter=paths>\n['a', 'b']\n</parameter>\n"
            "<parameter=extra>\n7\n</parameter>\n</function>\n</tool_call>")
    p = parse_tool_calls(text, "qwen3_coder", CallRules({"bash": SCHEMA}))
    assert p.text == "I'll check." and not p.parse_error
    assert p.calls[0].arguments == {"command": "echo 'a\nb' > f.txt", "timeout": 30, "ratio": 2, "force": True,
                                    "env": {"A": 1}, "paths": ["a", "b"], "extra": "7"}
    # A value that does not convert stays text; `null` is None; </function> may be missing (SGLang accepts it).
    p = parse_tool_calls("<tool_call><function=bash><parameter=timeout>soon</parameter><parameter=command>null"
                         "</parameter></tool_call>", "qwen3_coder", CallRules({"bash": SCHEMA}))
    assert p.calls[0].arguments == {"timeout": "soon", "command": None}
    assert p.calls[0].arguments_json == '{"timeout": "soon", "command": null}'
    # Two calls, each in its own block; text after the calls is kept.
    two = parse_tool_calls(CODER + "\n" + CODER.replace("ls -la", "pwd") + "\nDone.", "qwen3_coder",
                           CallRules({"bash": SCHEMA}))
    assert [c.arguments["command"] for c in two.calls] == ["ls -la", "pwd"] and two.text == "Done."
    bad = parse_tool_calls("<tool_call>\n<function=bash>\nls\n</function>\n</tool_call>", "qwen3_coder")
    assert bad.calls == [] and bad.parse_error and "<function=bash>" in bad.text
    # The JSON form is not Qwen3-Coder's: text, flagged.
    assert parse_tool_calls(HERMES, "qwen3_coder").calls == []


def test_arguments_stream_as_they_are_written():
    p = OutputParser(ParserSetup("qwen25"), tools=TOOLS)
    events = []
    for ch in HERMES:
        events += p.feed(ch)
    events += p.finish()
    deltas = [e.arguments for e in events if isinstance(e, ToolCallDelta)]
    assert len(deltas) > 10 and "".join(deltas) == '{"command": "ls -la", "timeout": 5}'
    start = next(k for k, e in enumerate(events) if isinstance(e, ToolCallStart))
    first_delta = next(k for k, e in enumerate(events) if isinstance(e, ToolCallDelta))
    assert start < first_delta  # the name is announced before any argument
    # Qwen3-Coder streams one closed parameter at a time, as SGLang does.
    p = OutputParser(ParserSetup("qwen3_coder"), tools=TOOLS)
    events = [e for ch in CODER for e in p.feed(ch)] + p.finish()
    assert [e.arguments for e in events if isinstance(e, ToolCallDelta)] == ['{"command": "ls -la"', ', "timeout": 5',
                                                                            "}"]


def test_malformed_call_after_its_name_streamed_is_closed_and_kept_as_text():
    text = 'Try.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"\n</tool_call>'
    p = OutputParser(ParserSetup("hermes"), tools=TOOLS)
    events = [e for ch in text for e in p.feed(ch)] + p.finish()
    end = next(e for e in events if isinstance(e, ToolCallEvent))
    assert end.malformed and end.call.name == "bash"
    assert p.calls == [] and p.parse_error and p.text == text
    check_stream(events, p)


def test_reasoning_parsers():
    qwen3 = ParserSetup("qwen25", "qwen3")
    p = parse_output("<think>\nFirst, list.\nThen count.\n</think>\n\nThere are 2.", qwen3)
    assert (p.reasoning, p.text) == ("First, list.\nThen count.", "There are 2.")
    assert parse_output("No thinking here.", qwen3).reasoning == ""
    assert parse_output("Say <think> later", qwen3).text == "Say <think> later"  # only a leading <think> opens it
    # A template that opened <think> in the generation prompt (Qwen3-2507 Thinking): the answer continues it.
    p = parse_output("planning\n</think>\n\nok", qwen3, in_reasoning=True)
    assert (p.reasoning, p.text) == ("planning", "ok")
    # A tool call before </think> closes the thinking (SGLang's rule for Qwen3); calls inside thinking are
    # never parsed otherwise.
    p = parse_output("<think>\nI will run ls.\n" + HERMES, qwen3, tools=TOOLS)
    assert p.reasoning == "I will run ls." and p.calls[0].arguments["command"] == "ls -la" and p.text == ""
    p = parse_output("<think>\nmaybe " + HERMES.replace("<tool_call>", "<tool_cal") + "\n</think>\nno", qwen3,
                     tools=TOOLS)
    assert p.calls == [] and p.text == "no"
    # DeepSeek-R1 thinks from the first token; an unclosed block is all thinking.
    r1 = ParserSetup("hermes", "deepseek_r1")
    assert (parse_output("a\n</think>b", r1).reasoning, parse_output("a\n</think>b", r1).text) == ("a", "b")
    assert (parse_output("<think>x", r1).reasoning, parse_output("<think>x", r1).text) == ("x", "")
    none = parse_output("<think>\nx\n</think>\ny", ParserSetup("hermes", "none"))
    assert none.reasoning == "" and none.text == "<think>\nx\n</think>\ny"
    stream = ReasoningParser("qwen3")
    out = [stream.feed(c) for c in "<think>\n\nab\n\ncd\n\n</think>\n\nz"]
    assert "".join(d.text for ds, _ in out for d in ds) == "ab\n\ncd" == stream.reasoning


def test_strict_mode_matches_sglang_rules():
    strict, lenient = ParserSetup("qwen25", strict=True), ParserSetup("qwen25")
    other = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    assert parse_output(other, lenient, tools=TOOLS).calls[0].name == "rm_rf"
    s = parse_output(other, strict, tools=TOOLS)
    assert s.calls == [] and s.parse_error and s.text == other  # never offered: not a call
    tight = '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'
    assert parse_output(tight, lenient, tools=TOOLS).calls and not parse_output(tight, strict, tools=TOOLS).calls
    stringified = '<tool_call>\n{"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}\n</tool_call>'
    assert parse_output(stringified, lenient, tools=TOOLS).calls[0].arguments == {"command": "ls"}
    assert parse_output(stringified, strict, tools=TOOLS).calls == []
    # Strict parses no calls when the request offers no tools (SGLang runs no detector then).
    assert parse_output(HERMES, strict, tools=[]).calls == [] and not parse_output(HERMES, strict).parse_error
    assert parse_output(HERMES, lenient, tools=[]).calls


def test_tool_choice_none_and_named():
    setup = ParserSetup("qwen25")
    none = parse_output(HERMES, setup, tools=TOOLS, tool_choice="none")
    assert none.calls == [] and none.text == HERMES and not none.parse_error
    two = [{"type": "function", "function": {"name": n, "parameters": {}}} for n in ("bash", "edit")]
    edit = HERMES.replace('"bash"', '"edit"')
    named = parse_output(HERMES + "\n" + edit, setup, tools=two, tool_choice={"name": "edit"})
    assert [c.name for c in named.calls] == ["edit"] and named.parse_error and HERMES in named.text
    assert len(parse_output(HERMES + "\n" + edit, setup, tools=two, tool_choice="required").calls) == 2


def test_auto_reads_the_chat_template():
    text = {name: (TEMPLATES / f"{name}.jinja").read_text() for name in ("qwen2.5", "qwen3", "qwen3-coder")}
    assert resolve_tool_parser("auto", text["qwen2.5"]) == resolve_tool_parser("auto", text["qwen3"]) == "qwen25"
    assert resolve_tool_parser("auto", text["qwen3-coder"]) == "qwen3_coder"
    assert resolve_tool_parser("auto", "{{ messages }}") == "hermes" and resolve_tool_parser("qwen", "") == "qwen25"
    assert resolve_reasoning_parser("auto", text["qwen3"]) == "qwen3"
    assert resolve_reasoning_parser("auto", text["qwen2.5"]) == resolve_reasoning_parser("auto", text["qwen3-coder"]) \
        == "none"
    assert resolve_reasoning_parser("deepseek-r1", "") == "deepseek_r1"
    with pytest.raises(UnknownParser, match="tool_parser"):
        ParserSetup.resolve("llama3", "auto", "", strict=False)


def test_forge_model_tiny_template_builds_each_real_template(tmp_path):
    from transformers import AutoTokenizer
    from typer.testing import CliRunner

    from openforge.forge_cli.main import app

    runner = CliRunner()
    for name in ("qwen2.5", "qwen3", "qwen3-coder"):
        result = runner.invoke(app, ["model", "tiny", str(tmp_path / name), "--template", name])
        assert result.exit_code == 0 and f"{name} template" in result.output, result.output
        tok = AutoTokenizer.from_pretrained(str(tmp_path / name))
        assert tok.chat_template == (TEMPLATES / f"{name}.jinja").read_text()
        assert len(tok.encode("<think></think>", add_special_tokens=False)) == 2  # one added token each
    bad = runner.invoke(app, ["model", "tiny", str(tmp_path / "x"), "--template", "llama3"])
    assert bad.exit_code == 1 and "--template must be one of tiny, qwen2.5, qwen3, qwen3-coder" in bad.output
