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
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

from proxy.calls import TextDelta, ToolCall, ToolCallDelta, ToolCallEvent, ToolCallStart, new_call_id

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


@dataclass
class CallRules:
    """What the request allows: its tools (name -> JSON schema of the parameters), strictness, and
    `only`: the one tool a named tool_choice allows (None: any)."""

    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    strict: bool = False
    only: str | None = None

    def allows(self, name: str) -> bool:
        if not name or (self.only is not None and name != self.only):
            return False
        return name in self.tools or not self.strict


@dataclass
class Parsed:
    name: str
    arguments: dict[str, Any]
    raw: str  # the arguments' JSON text, as streamed


# -- formats: the header (the call's name, once readable), streamed arguments, the whole body ----

_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)')


class JsonFormat:
    """hermes / qwen25: a JSON object with `name` and `arguments` (or `parameters`)."""

    def __init__(self, *, newlines: bool, strict: bool) -> None:
        self.newlines = newlines  # qwen25 strict: the body is "\n{...}\n"
        self.strict = strict

    def header(self, body: str) -> tuple[str, int] | None:
        if self.newlines and not body.startswith("\n"):
            return None
        m = _HEADER.match(body)
        if m is None:
            return None
        try:
            return json.loads(f'"{m.group(1)}"'), m.end()
        except json.JSONDecodeError:
            return None

    def new_state(self, start: int) -> JsonState:
        return JsonState(start)

    def advance(self, body: str, limit: int, name: str, state: JsonState) -> str:
        """The arguments text written since the last call (up to the object's end once it is closed)."""
        end = state.scanner.scan(body, state.emitted, limit)
        stop = end if end is not None else limit
        if stop <= state.emitted:
            return ""
        delta, state.emitted = body[state.emitted:stop], stop
        return delta

    def parse(self, body: str, rules: CallRules) -> Parsed | None:
        if self.newlines and not (body.startswith("\n") and body.endswith("\n")):
            return None
        try:
            obj = json.loads(body)
        except (json.JSONDecodeError, RecursionError):
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            return None
        key = "arguments" if "arguments" in obj else "parameters"
        args = obj.get(key, {})
        raw = None
        if isinstance(args, str) and not self.strict:  # some models write the arguments as a JSON string
            raw = args
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return None
        if not isinstance(args, dict):
            return None
        if raw is None:
            m = re.search(rf'"{key}"\s*:\s*', body)
            end = ObjectScanner().scan(body, m.end(), len(body)) if m and body[m.end():m.end() + 1] == "{" else None
            raw = body[m.end():end] if m and end is not None else json.dumps(args, ensure_ascii=False)
        return Parsed(obj["name"], args, raw)


_FUNC = re.compile(r"\s*<function=([^>\n]+)>")
_PARAM = re.compile(r"<parameter=([^>\n]+)>")
_PARAM_ENDS = ("</parameter>", "<parameter=", "</function>")


class XmlFormat:
    """qwen3_coder: `<function=NAME>` then `<parameter=P>value</parameter>`s, then `</function>`."""

    def __init__(self, rules: CallRules) -> None:
        self.rules = rules

    def header(self, body: str) -> tuple[str, int] | None:
        m = _FUNC.match(body)
        return (m.group(1), m.end()) if m else None

    def new_state(self, start: int) -> XmlState:
        return XmlState(start)

    def _scan(self, body: str, limit: int, name: str, st: XmlState) -> None:
        """Read the parameters closed since the last call (resuming where it stopped)."""
        schema = self.rules.tools.get(name, {})
        while not st.closed:
            j = st.pos
            while j < limit and body[j].isspace():
                j += 1
            if body.startswith("</function>", j, limit):
                st.pos, st.closed = j + len("</function>"), True
                return
            if st.open is None:
                m = _PARAM.match(body, j, limit)
                if m is None:
                    return
                st.open = (m.group(1), m.end())
            param, value_at = st.open
            ends = [(i, tag) for tag in _PARAM_ENDS if (i := body.find(tag, max(value_at, st.search_from), limit)) >= 0]
            if not ends:  # the value is still being written: search only the new text next time
                st.search_from = max(value_at, limit - len("</parameter>"))
                return
            i, tag = min(ends)
            value = body[value_at:i]
            value = value[1:] if value.startswith("\n") else value
            value = value[:-1] if value.endswith("\n") else value
            st.params.append((param, _convert(value, param, schema)))
            st.pos, st.search_from, st.open = i + (len(tag) if tag == "</parameter>" else 0), 0, None

    def advance(self, body: str, limit: int, name: str, state: XmlState) -> str:
        before = (len(state.params), state.closed)
        self._scan(body, limit, name, state)
        if (len(state.params), state.closed) == before:
            return ""
        text = _args_json(state.params, state.closed)
        delta, state.emitted = text[state.emitted:], len(text)
        return delta

    def parse(self, body: str, rules: CallRules) -> Parsed | None:
        head = self.header(body)
        if head is None:
            return None
        st = XmlState(head[1])
        self._scan(body, len(body), head[0], st)
        if body[st.pos:].strip():  # anything but whitespace after the parameters: not this format
            return None
        return Parsed(head[0], dict(st.params), _args_json(st.params, True))


@dataclass
class JsonState:
    emitted: int  # the body's index up to which the arguments were streamed
    scanner: ObjectScanner = field(default_factory=lambda: ObjectScanner())


@dataclass
class XmlState:
    pos: int  # where the next parameter (or </function>) starts
    params: list[tuple[str, Any]] = field(default_factory=list)
    closed: bool = False
    search_from: int = 0  # where to look for the open value's end
    open: tuple[str, int] | None = None  # the parameter being written: its name, where its value starts
    emitted: int = 0  # characters of the arguments JSON streamed


def _args_json(params: list[tuple[str, Any]], closed: bool) -> str:
    """SGLang's streamed JSON for qwen3_coder: `{` + `"k": v` joined by `, ` + `}`."""
    if not params:
        return "{}" if closed else ""
    text = "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in params)
    return text + "}" if closed else text


def _schema_type(schema: Any) -> str:
    if not isinstance(schema, dict):
        return "string"
    kind = schema.get("type")
    if isinstance(kind, str):
        return kind
    if isinstance(kind, list):
        return next((t for t in kind if t != "null"), "string")
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            kinds = {_schema_type(s) for s in schema[key]} - {"null"}
            return kinds.pop() if len(kinds) == 1 else "string"
    if "properties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return "string"


def _convert(value: str, name: str, schema: dict[str, Any]) -> Any:
    """A parameter's text as its schema's type (SGLang's `_convert_param_value`): unknown parameters
    and strings stay text; a value that does not convert stays text too."""
    if value.lower() == "null":
        return None
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    if name not in props:
        return value
    kind = _schema_type(props[name]).lower()
    if kind in ("string", "str", "text", "varchar", "char", "enum"):
        return value
    if kind.startswith(("int", "uint", "long", "short", "unsigned")):
        try:
            return int(value)
        except ValueError:
            return value
    if kind.startswith(("num", "float")):
        try:
            number = float(value)
        except ValueError:
            return value
        return int(number) if number.is_integer() and "." not in value and "e" not in value.lower() else number
    if kind in ("boolean", "bool", "binary"):
        return value.lower() == "true"
    if kind in ("object", "array", "arr") or kind.startswith(("dict", "list")):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            pass
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value


class ObjectScanner:
    """Finds the end of the JSON object opening at `start`, resuming where the last call stopped
    (a streamed body grows a few characters at a time: each character is scanned once)."""

    def __init__(self) -> None:
        self.pos: int | None = None
        self.depth, self.in_str, self.escaped = 0, False, False
        self.end: int | None = None

    def scan(self, text: str, start: int, limit: int) -> int | None:
        """The index just past the object, or None while it is open (within `text[:limit]`)."""
        if self.end is not None:
            return self.end
        i = start if self.pos is None else self.pos
        depth, in_str, escaped = self.depth, self.in_str, self.escaped
        n = limit
        while i < n:
            c = text[i]
            i += 1
            if in_str:
                if escaped:
                    escaped = False
                elif c == "\\":
                    escaped = True
                elif c == '"':
                    in_str = False
            elif c == '"':
                in_str = True
            elif c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    self.end = i
                    return i
        self.pos, self.depth, self.in_str, self.escaped = i, depth, in_str, escaped
        return None


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
