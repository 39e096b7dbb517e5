"""A Harbor task's `[[environment.mcp_servers]]`, as forge maps them.

Harbor (harbor 0.26.0, `harbor/models/task/config.py` `MCPServerConfig`) declares an MCP server as

    [[environment.mcp_servers]]
    name = "codes"
    transport = "stdio"                 # "sse" (the default), "streamable-http" ("http" is read as it), "stdio"
    command = "python3"                 # stdio: run in the agent's container
    args = ["/opt/mcp/server.py"]
    # url = "http://mcp-server:8000/mcp"  sse / streamable-http: most often a docker-compose service
    # headers = {Authorization = "Bearer ${TOKEN}"}

and hands the list to the agent, which registers it its own way (Claude Code writes ~/.claude.json, Codex
its config.toml). forge gives the agent its own tool server instead (rollouts/runner/tool_server.py): a
stdio server becomes a task MCP server (rollouts/tasks/mcp_servers.py) run on the host, outside the
agent's reach and confined to no more than the agent's (sandbox/confine.py), in a copy of the task's
environment/ folder, its tools offered through the rollout's
bearer-gated route and every call recorded there. Its command and arguments that name a file of the
image are read through the Dockerfile's COPY lines back to the environment/ file they came from.

What forge does not run is refused with one line: a server over HTTP (a docker-compose service on the
agent's own network, or a process inside the agent's own container: either one the agent can reach and
change, where forge's task MCP servers run outside its reach and are recorded on the host), a stdio
server that names an image path no COPY brings from environment/, and headers (credentials from the
host's environment). The compose services themselves: rollouts/tasks/harbor/compose.py.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from openforge.rollouts.tasks.harbor.dockerfile import Step, copied_files

_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # RFC 9110 token, as Harbor checks it


class HarborMcpServer(BaseModel):
    """Harbor's MCPServerConfig: same names, same default transport ("sse"), same checks."""

    model_config = ConfigDict(extra="forbid")

    name: str
    transport: Literal["stdio", "sse", "streamable-http"] = "sse"
    url: str | None = None
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("transport", mode="before")
    @classmethod
    def _http(cls, value: Any) -> Any:
        return "streamable-http" if value == "http" else value

    @field_validator("headers")
    @classmethod
    def _header_names(cls, value: dict[str, str]) -> dict[str, str]:
        if bad := [n for n in value if not _HEADER_NAME.match(n)]:
            raise ValueError(f"invalid MCP HTTP header name: {bad[0]!r}")
        return value

    @model_validator(mode="after")
    def _fields(self) -> "HarborMcpServer":
        if self.transport != "stdio" and not self.url:
            raise ValueError(f"'url' is required for transport '{self.transport}'")
        if self.transport == "stdio" and not self.command:
            raise ValueError("'command' is required for transport 'stdio'")
        if self.transport == "stdio" and self.headers:
            raise ValueError("'headers' is only supported for HTTP MCP transports")
        return self


def image_copies(env_dir: Path, steps: list[Step]) -> dict[str, str]:
    """{absolute path in the image: the environment/ file it was copied from} for each file the Dockerfile's
    COPY/ADD `steps` bring from the build context (a folder's files each), each read in its own WORKDIR."""
    copies: dict[str, str] = {}
    for step in steps:
        copies.update(copied_files(env_dir, step))
    return copies


def _in_image(word: str, workdir: str) -> str:
    """`word` as the absolute path it names in the image (relative to the WORKDIR, as Harbor's exec runs)."""
    return word if word.startswith("/") else str(PurePosixPath(workdir) / word)


def mcp_server_records(servers: list[HarborMcpServer], copies: dict[str, str],
                       workdir: str) -> tuple[list[dict[str, Any]], set[str], list[str]]:
    """(the TaskSpec.mcp_servers records, the image paths they run from (served from the host, not copied
    to the agent), one line per server forge cannot run)."""
    records, host_side, reasons = [], set(), []
    for i, server in enumerate(servers):
        where = f"[[environment.mcp_servers]] {i} ({server.name})"
        if server.transport != "stdio":
            host = urlsplit(server.url or "").hostname or ""
            if host in ("localhost", "127.0.0.1", "::1", "0.0.0.0"):
                reasons.append(f"{where}: {server.url} is served inside the agent's own container, where the agent "
                               "could replace it; forge serves a task's MCP servers outside the sandbox (stdio ones)")
            else:
                reasons.append(f"{where}: {server.transport} at {server.url}: an MCP server over HTTP is a "
                               f"docker-compose service ({host or 'no host'}) on the agent's own network, where the "
                               "agent can reach and change it; forge serves a task's MCP servers from the host, "
                               "outside the agent's reach, and records their calls there (stdio ones)")
            continue
        words, used = [server.command or "", *server.args], []
        for n, word in enumerate(words):
            path = _in_image(word, workdir)
            if path in copies:
                used.append(path)
            elif word.startswith("/") and n > 0:  # an absolute command not copied is a program (/usr/bin/python3)
                reasons.append(f"{where}: {word} is a path in the image that no COPY brings from environment/ "
                               "(forge runs stdio MCP servers on the host, from the task's environment/ files)")
                break
        else:
            resolve = {w: copies[_in_image(w, workdir)] for w in words if _in_image(w, workdir) in copies}
            host_side.update(used)
            records.append({"name": server.name, "command": resolve.get(words[0], words[0]),
                            "args": [resolve.get(a, a) for a in server.args]})
    return records, host_side, reasons
