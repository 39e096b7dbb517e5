"""rollouts/runner/mcp_upstream.py: a rollout's sessions to its task's own stdio MCP servers, each confined in
a folder of its own: tools listed, calls answered (an error result is the tool's, not infrastructure's), the
process and folder gone at close; a server that will not start is an UpstreamFailed naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from openforge.rollouts.runner.mcp_upstream import McpUpstreams, UpstreamFailed
from openforge.rollouts.tasks.mcp_servers import McpServerSpec
from openforge.sandbox.confine import Confinement, ConfinementUnavailable

SERVER = '''from mcp.server.mcpserver import MCPServer

mcp = MCPServer("codes")


@mcp.tool()
def get_code(team: str) -> str:
    """The release code of a team."""
    if team != "blue":
        raise ValueError("no such team")
    return "Q-1234"


if __name__ == "__main__":
    mcp.run()
'''


@pytest.fixture(autouse=True)
def confinement() -> None:
    try:
        Confinement.required()
    except ConfinementUnavailable as exc:
        pytest.skip(f"stdio MCP servers run under bubblewrap: {exc}")


async def test_a_stdio_server_lists_and_answers_then_is_gone(tmp_path: Path) -> None:
    spec = McpServerSpec(name="codes", command="python3", args=["server.py"], files={"server.py": SERVER},
                         ready_timeout_s=60)
    folder = tmp_path / "servers"
    folder.mkdir()
    upstreams = McpUpstreams([spec], folder=folder)
    await upstreams.start()
    try:
        assert list(upstreams.tools) == ["get_code"] and upstreams.tools["get_code"][0] == "codes"
        assert await upstreams.call("get_code", {"team": "blue"}) == ("Q-1234", False)
        text, is_error = await upstreams.call("get_code", {"team": "red"})
        assert is_error and "get_code" in text  # the tool's own error result, for the agent to read
    finally:
        await upstreams.close()
    assert not list(folder.iterdir())  # the servers' folder is removed


async def test_a_server_that_will_not_start_is_named(tmp_path: Path) -> None:
    spec = McpServerSpec(name="broken", command="python3", args=["server.py"],
                         files={"server.py": "raise SystemExit('no config')\n"}, ready_timeout_s=20)
    upstreams = McpUpstreams([spec], folder=tmp_path)
    with pytest.raises(UpstreamFailed, match="MCP server broken"):
        await upstreams.start()
    await upstreams.close()
