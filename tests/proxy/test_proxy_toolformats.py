"""proxy/toolformats.py: how one `<tool_call>` body is read in each format (hermes/qwen25 JSON, qwen3_coder XML),
whole and streamed, and what a request's tools allow."""

from __future__ import annotations

from openforge.proxy.toolformats import CallRules, JsonFormat, XmlFormat

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}, "lines": {"type": "integer"}}}


def test_json_body_gives_name_arguments_and_their_text_as_written() -> None:
    body = '{"name": "read", "arguments": {"path": "a.txt", "lines": 3}}'
    got = JsonFormat(newlines=False, strict=False).parse(body, CallRules())
    assert (got.name, got.arguments, got.raw) == ("read", {"path": "a.txt", "lines": 3}, '{"path": "a.txt", "lines": 3}')
    assert JsonFormat(newlines=False, strict=False).parse('{"name": "", "arguments": {}}', CallRules()) is None
    assert JsonFormat(newlines=False, strict=False).parse('{"name": "read", "arguments": [1]}', CallRules()) is None


def test_json_arguments_written_as_a_string_are_read_unless_strict() -> None:
    body = '{"name": "read", "parameters": "{\\"path\\": \\"b\\"}"}'
    assert JsonFormat(newlines=False, strict=False).parse(body, CallRules()).arguments == {"path": "b"}
    assert JsonFormat(newlines=False, strict=True).parse(body, CallRules()) is None


def test_qwen25_strict_needs_the_body_on_its_own_lines() -> None:
    fmt = JsonFormat(newlines=True, strict=True)
    assert fmt.parse('{"name": "ls", "arguments": {}}', CallRules()) is None
    assert fmt.parse('\n{"name": "ls", "arguments": {}}\n', CallRules()).name == "ls"


def test_json_streamed_deltas_add_up_to_the_arguments_and_stop_at_the_object() -> None:
    fmt = JsonFormat(newlines=False, strict=False)
    body = '{"name": "read", "arguments": {"path": "a}b.txt"}} trailing'
    name, start = fmt.header(body)
    assert name == "read"
    state, out = fmt.new_state(start), ""
    for limit in range(start, len(body) + 1, 3):  # the body arrives a few characters at a time
        out += fmt.advance(body, limit, name, state)
    out += fmt.advance(body, len(body), name, state)
    assert out == '{"path": "a}b.txt"}'  # a brace inside a string does not close the object


def test_xml_parameters_take_their_schema_types_and_stream_as_sglang_does() -> None:
    rules = CallRules(tools={"read": SCHEMA})
    fmt = XmlFormat(rules)
    body = "<function=read>\n<parameter=path>\na.txt\n</parameter>\n<parameter=lines>\n12\n</parameter>\n</function>"
    got = fmt.parse(body, rules)
    assert (got.name, got.arguments) == ("read", {"path": "a.txt", "lines": 12})
    assert got.raw == '{"path": "a.txt", "lines": 12}'
    state, out = fmt.new_state(fmt.header(body)[1]), ""
    for limit in range(len(body) + 1):
        out += fmt.advance(body, limit, "read", state)
    assert out == got.raw
    assert fmt.parse(body + " and more text", rules) is None  # not this format


def test_call_rules_allow_what_the_request_named() -> None:
    assert CallRules(tools={"a": {}}).allows("b")  # lenient: an unknown tool is still a call
    assert not CallRules(tools={"a": {}}, strict=True).allows("b")
    assert not CallRules(tools={"a": {}, "b": {}}, only="a").allows("b")
    assert not CallRules().allows("")
