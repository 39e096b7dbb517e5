"""The one internal call shape every API flavour translates to and from.

    API request JSON --(openai_chat / openai_responses / anthropic .parse_request)--> CallRequest
    CallRequest --(tokens.PromptBuilder)--> prompt ids --(engine)--> completion ids
    completion ids --(parsing.OutputParser: reasoning, then tool calls)--> Completion
                   --(API .render_response / stream)--> JSON/SSE

Messages use the OpenAI chat roles (system, user, assistant, tool) because chat templates are
written against them; tools are OpenAI-style `{"type": "function", "function": {...}}` dicts because
that is what `apply_chat_template(tools=...)` renders.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

API_CHAT = "openai_chat"
API_RESPONSES = "openai_responses"
API_ANTHROPIC = "anthropic_messages"

# What went wrong, independent of any API; each API module maps a kind to its own error JSON.
# "context_length" is an invalid request the caller must shorten (OpenAI gives it its own code).
ErrorKind = Literal["invalid_request", "context_length", "authentication", "permission", "not_found",
                    "not_allowed", "too_large", "rate_limit", "overloaded", "server", "timeout"]
STATUS = {"invalid_request": 400, "context_length": 400, "authentication": 401, "permission": 403, "not_found": 404,
          "not_allowed": 405, "too_large": 413, "rate_limit": 429, "overloaded": 529, "server": 500, "timeout": 504}


class APIError(Exception):
    """An error the proxy answers in the calling API's own error shape."""

    def __init__(self, kind: ErrorKind, message: str, *, param: str | None = None,
                 status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.param = param
        self.status = status or STATUS[kind]
        self.retry_after = retry_after


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError("invalid_request", message, param=param)


def new_call_id(prefix: str = "call") -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]  # parsed JSON object (templates render it with tojson)
    id: str = field(default_factory=new_call_id)
    raw_arguments: str | None = None  # the exact JSON text the model wrote, when it wrote one

    @property
    def arguments_json(self) -> str:
        """What OpenAI-style APIs return as `arguments`: the model's own text where we have it."""
        import json

        return self.raw_arguments if self.raw_arguments is not None else json.dumps(self.arguments)


@dataclass
class Message:
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None  # the tool's name on a tool message
    reasoning: str = ""  # an assistant's thinking, apart from its content (Qwen3's <think>...</think>)
    # Text and images in the order sent, when the message has images (proxy/image_inputs.ImageInput);
    # `content` is then its text alone. None: a text-only message (`content` is all of it).
    parts: list[Any] | None = None

    @property
    def images(self) -> list[Any]:
        return [p for p in self.parts if not isinstance(p, str)] if self.parts else []

    def template_dict(self) -> dict[str, Any]:
        """The message as `apply_chat_template` expects it: content is a string, or for a message
        with images the content parts VLM templates render (`{"type": "image"}` where an image goes:
        Qwen2-VL's writes `<|vision_start|><|image_pad|><|vision_end|>`). Thinking goes in
        `reasoning_content`, the key reasoning templates (Qwen3's) read; others ignore it."""
        content: Any = self.content
        if self.images:
            content = [{"type": "text", "text": p} if isinstance(p, str) else {"type": "image"} for p in self.parts]
        out: dict[str, Any] = {"role": self.role, "content": content}
        if self.reasoning:
            out["reasoning_content"] = self.reasoning
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": tc.id, "type": "function", "function": {"name": tc.name, "arguments": tc.arguments}}
                for tc in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


@dataclass
class CallRequest:
    api: str
    model: str
    messages: list[Message]
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: Any = "auto"  # "auto" | "none" | "required" | {"name": ...}; see proxy/parsing.py
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # Anthropic's; an extension (vLLM's, SGLang's) on the OpenAI APIs
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    seed: int | None = None
    namespaces: dict[str, str] = field(default_factory=dict)  # Responses: tool name -> its namespace

    @property
    def prompt_tools(self) -> list[dict[str, Any]]:
        """The tools the template shows the model (none when the caller forbids calling them)."""
        return [] if self.tool_choice == "none" else self.tools


@dataclass
class Completion:
    """The model's answer, parsed: text, tool calls, and the exact tokens behind them."""

    text: str
    tool_calls: list[ToolCall]
    finish_reason: Literal["stop", "length", "tool_calls"]
    completion_ids: list[int]
    logprobs: list[float]
    prompt_tokens: int
    tool_parse_error: bool = False
    stop_sequence: str | None = None  # the caller's stop string that ended it, if one did
    reasoning: str = ""  # the thinking the reasoning parser split off the text
    reasoning_tokens: int = 0  # completion tokens up to and including `</think>` (0 where it is not one token)

    @property
    def completion_tokens(self) -> int:
        return len(self.completion_ids)

    def message(self) -> Message:
        """The assistant message a harness will replay for this completion."""
        return Message(role="assistant", content=self.text, tool_calls=list(self.tool_calls), reasoning=self.reasoning)


@dataclass
class TextDelta:
    """Streaming: text to show now."""

    text: str


@dataclass
class ReasoningDelta:
    """Streaming: thinking to show now (before the answer's text)."""

    text: str


@dataclass
class ToolCallStart:
    """Streaming: a tool call begins, its name read; argument deltas and its `ToolCallEvent` follow."""

    index: int  # the call's position in the stream (a call that turns out malformed keeps its index)
    id: str
    name: str


@dataclass
class ToolCallDelta:
    """Streaming: more of a started call's arguments JSON, as the model writes it."""

    index: int
    arguments: str


@dataclass
class ToolCallEvent:
    """Streaming: a started call is complete. `malformed`: its body then failed to parse, so the
    completion holds it as text (a TextDelta with the raw text follows); the stream closes it as is."""

    index: int
    call: ToolCall
    malformed: bool = False


StreamEvent = TextDelta | ReasoningDelta | ToolCallStart | ToolCallDelta | ToolCallEvent


def sse(data: Any, event: str | None = None) -> str:
    """One server-sent event. JSON is compact: chunks are small and many (orjson writes the same
    compact UTF-8 JSON as `json.dumps` in a fifth of the time; what it cannot write goes that way)."""
    if isinstance(data, str):
        payload = data
    else:
        try:
            payload = orjson.dumps(data).decode()
        except (TypeError, orjson.JSONEncodeError):
            payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"


def as_int(body: dict[str, Any], key: str, *, low: int = 0, high: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise bad_request(f"'{key}' must be an integer {bound}", key)
    return value


def as_float(body: dict[str, Any], key: str, *, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise bad_request(f"'{key}' must be a number between {low:g} and {high:g}", key)
    return float(value)


def as_stop(value: Any, key: str = "stop") -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list) and all(isinstance(s, str) for s in value) and len(value) <= 16:
        return [s for s in value if s]
    raise bad_request(f"'{key}' must be a string or a list of up to 16 strings", key)


def parse_arguments(raw: Any, where: str) -> dict[str, Any]:
    """Tool-call arguments as replayed by a client (a JSON string or an object) -> a dict."""
    import json

    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            raise bad_request(f"{where} is not valid JSON", where) from None
        if isinstance(value, dict):
            return value
    raise bad_request(f"{where} must be a JSON object", where)
