"""A completion's text -> thinking, answer text and tool calls, with the parsers the proxy is set to.

    text --(reasoning.ReasoningParser)--> thinking | answer --(toolcalls.ToolCallParser)--> text | calls

`proxy.tool_parser` and `proxy.reasoning_parser` name the formats (SGLang's names; `auto` reads the
chat template). Tool calls are only looked for in the answer, never in the thinking. The request's
`tool_choice` decides what may be parsed:

    auto / required   every offered tool (with `proxy.tool_parser_strict` off, any name the model
                      writes). Neither engine constrains decoding, so `required` cannot force a
                      call: an answer without one is returned as generated (finish_reason "stop").
    {name: X}         only X: a call to another tool stays text, flagged tool_parse_error
    none              the template is shown no tools and nothing is parsed as a call
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from openforge.proxy.calls import CallRequest, ReasoningDelta, StreamEvent, ToolCall
from openforge.proxy.reasoning import REASONING_PARSERS, ReasoningParser, opens_thinking, resolve_reasoning_parser
from openforge.proxy.reasoning import ALIASES as REASONING_ALIASES
from openforge.proxy.toolcalls import ALIASES as TOOL_ALIASES
from openforge.proxy.toolcalls import TOOL_PARSERS, ToolCallParser, resolve_tool_parser
from openforge.proxy.toolformats import CallRules


class UnknownParser(ValueError):
    pass


def check_parser_names(tool_parser: str, reasoning_parser: str) -> None:
    if TOOL_ALIASES.get(tool_parser, tool_parser) not in TOOL_PARSERS:
        raise UnknownParser(f"unknown tool_parser {tool_parser!r}: one of {', '.join(TOOL_PARSERS)}")
    if REASONING_ALIASES.get(reasoning_parser, reasoning_parser) not in REASONING_PARSERS:
        raise UnknownParser(f"unknown reasoning_parser {reasoning_parser!r}: one of {', '.join(REASONING_PARSERS)}")


@dataclass(frozen=True)
class ParserSetup:
    """The resolved parsers of a served model (never `auto`)."""

    tool_parser: str = "hermes"
    reasoning_parser: str = "none"
    strict: bool = False

    @classmethod
    def resolve(cls, tool_parser: str, reasoning_parser: str, chat_template: str, *, strict: bool) -> ParserSetup:
        check_parser_names(tool_parser, reasoning_parser)
        return cls(resolve_tool_parser(tool_parser, chat_template),
                   resolve_reasoning_parser(reasoning_parser, chat_template), strict)

    def for_request(self, req: CallRequest, *, prompt_text: str = "", id_prefix: str = "call") -> OutputParser:
        return OutputParser(self, tools=req.tools, tool_choice=req.tool_choice,
                            in_reasoning=opens_thinking(prompt_text), id_prefix=id_prefix)


class OutputParser:
    """Incremental: `feed(text)` / `finish()` return stream events; then `text`, `reasoning`,
    `calls`, `parse_error` hold the whole completion."""

    def __init__(self, setup: ParserSetup, *, tools: list[dict[str, Any]] | None = None, tool_choice: Any = "auto",
                 in_reasoning: bool = False, id_prefix: str = "call") -> None:
        schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools or []}
        kind = setup.tool_parser
        if tool_choice == "none" or (setup.strict and not schemas):  # SGLang parses calls only when tools are offered
            kind = "none"
        only = tool_choice.get("name") if isinstance(tool_choice, dict) else None
        self.reasoning_parser = ReasoningParser(setup.reasoning_parser, in_reasoning=in_reasoning)
        self.tools = ToolCallParser(kind, CallRules(schemas, setup.strict, only), id_prefix)

    def feed(self, chunk: str) -> list[StreamEvent]:
        deltas, answer = self.reasoning_parser.feed(chunk)
        return [*deltas, *self.tools.feed(answer)]

    def finish(self) -> list[StreamEvent]:
        deltas, answer = self.reasoning_parser.finish()
        events: list[StreamEvent] = [*deltas]
        return events + self.tools.feed(answer) + self.tools.finish()

    @property
    def text(self) -> str:
        return self.tools.text

    @property
    def reasoning(self) -> str:
        return self.reasoning_parser.reasoning

    @property
    def calls(self) -> list[ToolCall]:
        return self.tools.calls

    @property
    def parse_error(self) -> bool:
        return self.tools.parse_error


def parse_output(text: str, setup: ParserSetup | None = None, **kw: Any) -> OutputParser:
    parser = OutputParser(setup or ParserSetup(), **kw)
    parser.feed(text)
    parser.finish()
    return parser


__all__ = ["OutputParser", "ParserSetup", "ReasoningDelta", "UnknownParser", "check_parser_names", "parse_output"]
