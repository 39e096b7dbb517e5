"""Regenerate tests/data/sglang_parsers.json: SGLang's own parse of a corpus of model outputs.

Runs in a separate venv that has SGLang (its function-call and reasoning modules run on CPU):

    python3.11 -m venv /tmp/sgl && /tmp/sgl/bin/pip install --no-deps sglang==0.5.23
    /tmp/sgl/bin/pip install numpy orjson psutil pybase64 requests torch packaging pillow starlette msgspec \\
        pydantic zmq tqdm IPython aiohttp openai partial_json_parser transformers   # what those modules import
    /tmp/sgl/bin/python tests/data/make_sglang_parsers.py

tests/test_proxy_sglang_conformance.py compares the proxy's parse of the same corpus with it.
Each case holds SGLang's non-streaming parse and its streaming parse (fed 3 characters at a time).
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path

from sglang.srt.entrypoints.openai.protocol import Function, Tool
from sglang.srt.function_call.function_call_parser import FunctionCallParser
from sglang.srt.parser.reasoning_parser import ReasoningParser

SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"},
                                           "ratio": {"type": "number"}, "force": {"type": "boolean"},
                                           "env": {"type": "object"}, "paths": {"type": "array"}},
          "required": ["command"]}
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command", "parameters": SCHEMA}},
         {"type": "function", "function": {"name": "write_file", "description": "Write a file", "parameters": {
             "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}}}}]

J = '<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'
X = "<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def j(name: str, args: str) -> str:
    return J.format(name=name, args=args)


def x(name: str, **params: str) -> str:
    return X.format(name=name, params="".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items()))


JSON_CASES = {
    "plain_text": "There are 3 files.",
    "one_call": j("bash", '{"command": "ls -la"}'),
    "compact_json": '<tool_call>\n{"name":"bash","arguments":{"command":"ls"}}\n</tool_call>',
    "text_then_call": "Let me look.\n" + j("bash", '{"command": "ls"}'),
    "two_calls": j("bash", '{"command": "ls"}') + "\n" + j("write_file", '{"path": "a.txt", "content": "hi\\n"}'),
    "nested_unicode": j("write_file", '{"path": "é.txt", "content": "{\\"k\\": [1, 2]} – ok"}'),
    "parameters_key": '<tool_call>\n{"name": "bash", "parameters": {"command": "pwd"}}\n</tool_call>',
    "no_newlines": '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>',
    "undeclared_tool": j("rm_rf", '{"path": "/"}'),
    "malformed_json": '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"\n</tool_call>',
    "stringified_arguments": '<tool_call>\n{"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}\n</tool_call>',
    "text_after_call": j("bash", '{"command": "ls"}') + "\nI listed them.",
    "unclosed_call": '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}',
}
XML_CASES = {
    "plain_text": "There are 3 files.",
    "one_call": x("bash", command="ls -la"),
    "text_then_call": "I'll check.\n\n" + x("bash", command="ls"),
    "typed_params": x("bash", command="sleep 1", timeout="30", ratio="0.5", force="true", env='{"A": "1"}',
                      paths='["a", "b"]'),
    "multiline_value": x("write_file", path="main.py", content="def f():\n    return 1\n"),
    "two_calls": x("bash", command="ls") + "\n" + x("write_file", path="a.txt", content="hi"),
    "param_not_in_schema": x("bash", command="ls", verbose="true"),
    "missing_function_close": "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n</tool_call>",
    "undeclared_tool": x("rm_rf", path="/"),
    "null_and_bad_int": x("bash", command="null", timeout="soon"),
}
REASONING_CASES = {
    "qwen3": {"think_then_answer": "<think>\nList first.\nThen count.\n</think>\n\nThere are 2.",
              "no_think": "There are 2.",
              "think_then_call": "<think>\nI will run ls.\n</think>\n\n" + j("bash", '{"command": "ls"}'),
              "call_inside_unclosed_think": "<think>\nI will run ls.\n" + j("bash", '{"command": "ls"}')},
    "qwen3-thinking": {"opened_by_template": "List first.\n</think>\n\nThere are 2."},
    "deepseek-r1": {"closed": "Think.\n</think>\n\nAnswer.", "with_open_tag": "<think>\nThink.\n</think>\nAnswer.",
                    "unclosed": "Still thinking"},
}


def sglang_tools() -> list[Tool]:
    return [Tool(type="function", function=Function(**t["function"])) for t in TOOLS]


def tool_parse(parser: str, text: str) -> dict:
    one = FunctionCallParser(sglang_tools(), parser)
    normal, calls = one.parse_non_stream(text)
    streaming = FunctionCallParser(sglang_tools(), parser)
    s_normal, s_calls = "", {}
    for i in range(0, len(text), 3):
        got, items = streaming.parse_stream_chunk(text[i:i + 3])
        s_normal += got
        for item in items:
            name, params = s_calls.get(item.tool_index, ("", ""))
            s_calls[item.tool_index] = (name or item.name or "", params + (item.parameters or ""))
    return {"normal_text": normal, "calls": [{"name": c.name, "parameters": c.parameters} for c in calls],
            "stream": {"normal_text": s_normal,
                       "calls": [{"name": n, "parameters": p} for _, (n, p) in sorted(s_calls.items())]}}


def reasoning_parse(parser: str, text: str) -> dict:
    reasoning, normal = ReasoningParser(parser, stream_reasoning=False).parse_non_stream(text)
    return {"reasoning_text": reasoning or "", "normal_text": normal or ""}


def main() -> None:
    out = {"sglang_version": version("sglang"), "generator": "tests/data/make_sglang_parsers.py", "tools": TOOLS,
           "tool_cases": [], "reasoning_cases": []}
    for parser, cases in (("qwen25", JSON_CASES), ("hermes", JSON_CASES), ("qwen3_coder", XML_CASES)):
        for name, text in cases.items():
            out["tool_cases"].append({"parser": parser, "name": name, "text": text, "sglang": tool_parse(parser, text)})
    for parser, cases in REASONING_CASES.items():
        for name, text in cases.items():
            out["reasoning_cases"].append({"parser": parser, "name": name, "text": text,
                                           "sglang": reasoning_parse(parser, text)})
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("sglang_parsers.json")
    path.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {path}: {len(out['tool_cases'])} tool-call cases, {len(out['reasoning_cases'])} reasoning cases, "
          f"sglang {out['sglang_version']}")


if __name__ == "__main__":
    main()
