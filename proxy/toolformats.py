"""Tool-call formats: how each parser reads one `<tool_call>` body (proxy/toolcalls.py drives them).

Each format reads a body three ways: its `header` (the call's name, once written: the stream can
announce the call), `advance` (the arguments JSON written since the last look, resuming where it
stopped, so a long call costs linear time as it streams), and `parse` (the whole body, once closed).

    JsonFormat   hermes / qwen25: {"name": ..., "arguments": {...}} (or "parameters")
    XmlFormat    qwen3_coder: <function=NAME><parameter=P>value</parameter>...</function>; values
                 converted by the tool's JSON schema as SGLang's Qwen3CoderDetector converts them
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any


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
