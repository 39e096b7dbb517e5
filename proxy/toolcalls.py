"""Tool-call parsers: the calls a model writes in its answer, named as SGLang names its detectors.

    hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any whitespace inside
    qwen25       the same as Qwen2.5/Qwen3 write it: <tool_call>\\n{json}\\n</tool_call> (alias `qwen`)
    qwen3_coder  <tool_call>\\n<function=NAME>\\n<parameter=P>\\nvalue\\n</parameter>\\n</function>\\n</tool_call>;
                 a value is converted by the type its tool's JSON schema gives the parameter, as
                 SGLang's Qwen3CoderDetector does (string, integer, number, boolean, object/array)

Text outside the tags is the answer; whitespace around a call is layout. A call's name is
announced (`ToolCallStart`) as soon as it is read and its arguments stream as the model writes them
(`ToolCallDelta`: the JSON text itself for hermes/qwen25; one `"key": value` per closed parameter
for qwen3_coder, as SGLang streams it), then `ToolCallEvent` closes it. A call whose body does not
parse is returned as text and flagged (`parse_error`); if its name was already streamed, the stream
closes it with `malformed=True` and the raw text follows (the completion holds it as text).

`strict` matches SGLang: qwen25 requires its newlines, arguments written as a JSON string are not
decoded, and a call to a tool the request did not offer is not a call (SGLang drops it from the
answer; here it stays as text, flagged, so the harness and the trajectory still see what the model
wrote). Without `strict` (the default) those are accepted, as the proxy always has.

How each format reads a body (name, streamed arguments, whole parse): proxy/toolformats.py.
"""

from __future__ import annotations

from openforge.proxy.calls import TextDelta, ToolCall, ToolCallDelta, ToolCallEvent, ToolCallStart, new_call_id
from openforge.proxy.toolformats import CallRules, JsonFormat, JsonState, XmlFormat, XmlState

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
TOOL_PARSERS = ("auto", "hermes", "qwen25", "qwen3_coder", "none")
ALIASES = {"qwen": "qwen25"}  # SGLang registers Qwen25Detector under both names

Event = TextDelta | ToolCallStart | ToolCallDelta | ToolCallEvent


def resolve_tool_parser(name: str, chat_template: str) -> str:
    """`auto`, as SGLang's template detection decides: `<function=` + `<parameter=` is Qwen3-Coder's
    XML; a template that writes `<tool_call>` is Qwen2.5/Qwen3's JSON (`qwen25`); else `hermes`,
    the proxy's lenient default for a template it does not know."""
    name = ALIASES.get(name, name)
    if name != "auto":
        return name
    if "<function=" in chat_template and "<parameter=" in chat_template:
        return "qwen3_coder"
    if OPEN_TAG in chat_template:
        return "qwen25"
    return "hermes"


# -- the incremental parser --------------------------------------------------------------------


class ToolCallParser:
    """Incremental: text outside `<tool_call>...</tool_call>` is content, a body that parses is a
    call. Feeding the text in any chunking gives the same text, calls and flag (streaming ==
    non-streaming); only the streamed events of a malformed call depend on where it broke."""

    def __init__(self, kind: str = "hermes", rules: CallRules | None = None, id_prefix: str = "call") -> None:
        self.kind = ALIASES.get(kind, kind)
        self.rules = rules or CallRules()
        self.id_prefix = id_prefix
        self.format: JsonFormat | XmlFormat = (
            XmlFormat(self.rules) if self.kind == "qwen3_coder"
            else JsonFormat(newlines=self.kind == "qwen25" and self.rules.strict, strict=self.rules.strict))
        self.buf = ""
        self.in_call = False
        self.pending_ws = ""  # trailing whitespace held back: dropped if a tool call follows
        self.ws_before = ""
        self.after_call = False
        self.calls: list[ToolCall] = []
        self.text_parts: list[str] = []
        self.parse_error = False
        self.started = 0  # calls announced in the stream
        self.live: tuple[int, str, str] | None = None  # the open call: stream index, id, name
        self.state: JsonState | XmlState | None = None  # its format's progress through the body
        self.sent: list[str] = []  # its arguments streamed so far
        self.close_from = 0  # where to look for </tool_call> next (text before it was searched)
        self.headless = False  # the open call will not be announced before it closes

    def feed(self, chunk: str) -> list[Event]:
        if self.kind == "none":
            return self._plain(chunk)
        self.buf += chunk
        events: list[Event] = []
        while True:
            if not self.in_call:
                i = self.buf.find(OPEN_TAG)
                if i < 0:
                    hold = _partial_suffix(self.buf, OPEN_TAG)
                    self._text(self.buf[:len(self.buf) - hold], events)
                    self.buf = self.buf[len(self.buf) - hold:]
                    return events
                self._text(self.buf[:i], events)
                # Whitespace before a call is layout, not content (kept if the call is malformed).
                self.ws_before, self.pending_ws = self.pending_ws, ""
                self.buf, self.in_call, self.headless = self.buf[i + len(OPEN_TAG):], True, False
            else:
                j = self.buf.find(CLOSE_TAG, self.close_from)
                if j < 0:
                    self.close_from = max(0, len(self.buf) - len(CLOSE_TAG) + 1)
                    self._stream(self.buf, len(self.buf) - _partial_suffix(self.buf, CLOSE_TAG), events)
                    return events
                body, self.buf, self.in_call, self.close_from = self.buf[:j], self.buf[j + len(CLOSE_TAG):], False, 0
                self._close(body, CLOSE_TAG, events)

    def finish(self) -> list[Event]:
        events: list[Event] = []
        if self.in_call:  # unclosed: a call if its body is whole (SGLang accepts it), else raw text
            self.in_call = False
            self._close(self.buf, "", events)
        else:
            self._text(self.buf, events, final=True)
        self.buf = ""
        if self.pending_ws and not self.after_call:
            self._emit(self.pending_ws, events)
        self.pending_ws = ""
        return events

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    def _plain(self, chunk: str) -> list[Event]:
        if chunk:
            self.text_parts.append(chunk)
            return [TextDelta(chunk)]
        return []

    def _stream(self, body: str, limit: int, events: list[Event]) -> None:
        """Announce the open call once its name is read, then stream its arguments (`body[:limit]`
        is what may be read: the rest could be the start of the closing tag)."""
        if self.live is None:
            if self.headless:
                return
            head = self.format.header(body[:limit] if len(body) - limit else body)
            if head is None or not self.rules.allows(head[0]) or head[1] > limit:
                # No name to announce: decided once the name is read (or the body is far past any
                # header); the call is then parsed whole when it closes.
                self.headless = head is not None and head[1] <= limit or limit > 1024
                return
            self.live = (self.started, new_call_id(self.id_prefix), head[0])
            self.state, self.sent = self.format.new_state(head[1]), []
            self.started += 1
            events.append(ToolCallStart(*self.live))
        delta = self.format.advance(body, limit, self.live[2], self.state)  # type: ignore[arg-type]
        if delta:
            self.sent.append(delta)
            events.append(ToolCallDelta(self.live[0], delta))

    def _close(self, body: str, close_tag: str, events: list[Event]) -> None:
        self._stream(body, len(body), events)
        parsed = self.format.parse(body, self.rules)
        live, self.live, self.state = self.live, None, None
        sent, self.sent = "".join(self.sent), []
        if parsed is not None and self.rules.allows(parsed.name) and (live is None or live[2] == parsed.name):
            index, call_id = (live[0], live[1]) if live else (self.started, new_call_id(self.id_prefix))
            if live is None:
                self.started += 1
                events.append(ToolCallStart(index, call_id, parsed.name))
            if parsed.raw.startswith(sent) and len(parsed.raw) > len(sent):
                events.append(ToolCallDelta(index, parsed.raw[len(sent):]))
            call = ToolCall(name=parsed.name, arguments=parsed.arguments, id=call_id, raw_arguments=parsed.raw)
            self.calls.append(call)
            self.after_call = True
            events.append(ToolCallEvent(index, call))
            return
        self.parse_error = True
        if live is not None:
            events.append(ToolCallEvent(live[0], ToolCall(live[2], {}, live[1], raw_arguments=sent), malformed=True))
        self.pending_ws = self.ws_before
        self._text(OPEN_TAG + body + close_tag, events, final=not close_tag)

    def _text(self, text: str, events: list[Event], final: bool = False) -> None:
        if not text:
            return
        if self.after_call:
            text = text.lstrip()
            if not text:
                return
            self.after_call = False
        body = text.rstrip()
        if not body:
            self.pending_ws += text
            return
        self._emit(self.pending_ws + body, events)
        self.pending_ws = text[len(body):]

    def _emit(self, text: str, events: list[Event]) -> None:
        self.text_parts.append(text)
        events.append(TextDelta(text))


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag` (held back while streaming).
    Such a suffix starts with the tag's first character: only those few places are tried."""
    i = text.find(tag[0], max(0, len(text) - len(tag) + 1))
    while i >= 0:
        if tag.startswith(text[i:]):
            return len(text) - i
        i = text.find(tag[0], i + 1)
    return 0


def parse_tool_calls(text: str, kind: str = "hermes", rules: CallRules | None = None,
                     id_prefix: str = "call") -> ToolCallParser:
    parser = ToolCallParser(kind, rules, id_prefix)
    parser.feed(text)
    parser.finish()
    return parser
