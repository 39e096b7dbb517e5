"""Task MCP servers: whole MCP servers a task brings (Harbor's `[[environment.mcp_servers]]`), their tools
handed to the agent through forge's own per-rollout tool server.

    [[mcp_servers]]
    name = "codes"
    command = "python3"                 # stdio: per rollout, outside the agent's sandbox, in one of its own
    args = ["mcp/server.py"]
    files = { "mcp/server.py" = "..." } # its folder (a Harbor task's environment/ files)

    [[mcp_servers]]
    name = "support"
    transport = "streamable-http"       # or "sse": a server that is one of the task's services
    service = "support-bot"
    path = "/mcp"

The harness never reaches these servers itself: the runner's ToolServer (rollouts/runner/tool_server.py)
is a client of each for the rollout (rollouts/runner/mcp_upstream.py), lists their tools beside the
task's own and carries every call out, so each call is a dispatch in the host's record and the agent's
route is the rollout's bearer-gated socket, as for any task tool. A server reached over HTTP is a task
service, so it is started per rollout and every request it gets is in the services' record too.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from openforge.rollouts.tasks.grading import check_relative_paths
from openforge.rollouts.tasks.services import check_name


class McpServerSpec(BaseModel):
    """One MCP server of a task (TaskSpec.mcp_servers): a stdio command, or a service speaking MCP."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="unique within the task: letters, digits, _ -")
    transport: Literal["stdio", "sse", "streamable-http"] = "stdio"
    command: str | None = Field(None, min_length=1, description=(
        "stdio: the program, run in the server's folder in a sandbox of its own (sandbox/confine.py; "
        "python/python3: forge's interpreter)"))
    args: list[str] = Field(default_factory=list, description="stdio: its arguments")
    files: dict[str, str] = Field(default_factory=dict, description="stdio: written into its folder first")
    env: dict[str, str] = Field(default_factory=dict, description="stdio: added to its environment")
    service: str | None = Field(None, description="sse / streamable-http: the task service that serves it")
    path: str = Field("/mcp", description="sse / streamable-http: its path on the service")
    timeout_s: float = Field(30.0, gt=0, le=600, description="one call's limit (past it: an infrastructure failure)")
    ready_timeout_s: float = Field(30.0, gt=0, le=300, description="how long it may take to start and list its tools")

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        return check_name(value)

    @field_validator("files")
    @classmethod
    def _check_files(cls, value: dict[str, str]) -> dict[str, str]:
        check_relative_paths(value, "the MCP server's folder")
        return value

    @model_validator(mode="after")
    def _one_route(self) -> "McpServerSpec":
        if self.transport == "stdio":
            if self.command is None or self.service is not None:
                raise ValueError(f"MCP server {self.name!r}: a stdio server needs a command and no service")
        elif self.service is None or self.command is not None or self.files:
            raise ValueError(f"MCP server {self.name!r}: a {self.transport} server needs a service (one of the "
                             "task's services) and no command or files")
        if not self.path.startswith("/"):
            raise ValueError(f"MCP server {self.name!r}: path must start with '/'")
        return self

