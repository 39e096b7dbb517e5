"""Task tools: tools a task gives the agent, served per rollout by an MCP server on the host.

    [[tools]]
    name = "lookup_order"
    description = "The status of an order"
    input_schema = { type = "object", properties = { id = { type = "string" } }, required = ["id"] }
    command = "python3 -c 'import json,sys; print(json.load(sys.stdin)[\"key\"].upper())'"  # confined, see below

    [[tools]]                                     # or forwarded to one of the task's services
    name = "send_email"
    description = "Send an email"
    input_schema = { type = "object" }
    service = "mail"
    method = "POST"
    path = "/send"

The runner starts one MCP server per rollout outside the sandbox (rollouts/runner/tool_server.py) and
records every dispatch there; each harness gets the server the way it takes tools (its spec's `[mcp]`,
docs/harnesses.md). After the agent is gone the grader finds the host's record at DISPATCH_FILE.
"""

from __future__ import annotations

import re
from typing import Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Where the host's record of the rollout's tool dispatches is written for the grader, after the agent
# is gone (in `.forge/`, which the runner moves aside first: a record the agent wrote there is not read).
DISPATCH_FILE = ".forge/tool-dispatches.jsonl"
DISPATCH_ENV = "FORGE_TOOL_DISPATCHES"
# Names the MCP clients accept (Claude Code, Codex and opencode prefix them with the server's name).
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
# mini's own tools: a task tool may not shadow one.
RESERVED_NAMES = frozenset({"bash", "read_file", "write_file"})


class TaskTool(BaseModel):
    """One tool: its name, description and JSON input schema, and one handler (`command` or `service`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="letters, digits, _ and -, starting with a letter (at most 64)")
    description: str = Field(min_length=1, description="what the agent is told the tool does")
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"},
                                         description="a JSON Schema object for the arguments")
    command: str | None = Field(None, min_length=1, description=(
        "a shell command run per call in a sandbox of its own (no host folder, no network, no key: "
        "sandbox/confine.py): the arguments as JSON on stdin, stdout is the result; a non-zero exit is an "
        "error result the agent sees. A tool that needs data is an MCP server or a service with `files`"))
    service: str | None = Field(None, min_length=1, description="a task service the call is forwarded to")
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    path: str = Field("/", description="the service's path; the arguments are the JSON body")
    timeout_s: float = Field(30.0, gt=0, le=600, description=(
        "one call's limit (past it: an error result the agent sees, its `failure` recorded)"))

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME_RE.match(value):
            raise ValueError("must be 1-64 letters, digits, '_' or '-', starting with a letter")
        if value in RESERVED_NAMES:
            raise ValueError(f"{value!r} is one of mini's own tools ({', '.join(sorted(RESERVED_NAMES))})")
        return value

    @field_validator("input_schema")
    @classmethod
    def _check_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        if value.get("type") != "object":  # MCP's Tool.inputSchema is always an object schema
            raise ValueError('must be a JSON Schema with type = "object"')
        return value

    @model_validator(mode="after")
    def _one_handler(self) -> "TaskTool":
        if (self.command is None) == (self.service is None):
            raise ValueError(f"tool {self.name!r} needs exactly one handler: command or service")
        if not self.path.startswith("/"):
            raise ValueError(f"tool {self.name!r}: path must start with '/'")
        return self


class _HasName(Protocol):
    @property
    def name(self) -> str: ...


_Named = TypeVar("_Named", bound=_HasName)


def check_unique(items: list[_Named], what: str = "tool") -> list[_Named]:
    """`items` (a task's tools, or its MCP servers), or ValueError naming the first one declared twice."""
    seen: set[str] = set()
    for item in items:
        if item.name in seen:
            raise ValueError(f"{what} {item.name!r} is declared twice")
        seen.add(item.name)
    return items
