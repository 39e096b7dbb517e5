"""rollouts/runner/tool_server.py: one rollout's task tools as an MCP server on the host (the real `mcp` package,
called by the real `mcp` client), behind the rollout's bearer token, every dispatch recorded on the host. Whole
rollouts that call a tool through each harness are tests/rollouts/tasks/test_task_tools.py's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from openforge.rollouts.runner.tool_server import ToolServer, dispatch_record_path
from openforge.rollouts.tasks.tools import TaskTool
from tests.helpers.task_tools import LOOKUP


async def _client_calls(server: ToolServer, token: str) -> tuple[list[str], Any, Any]:
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http:
        async with streamable_http_client(server.url, http_client=http) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                listed = await session.list_tools()
                good = await session.call_tool("lookup", {"key": "alpha"})
                unknown = await session.call_tool("nope", {})
    return [t.name for t in listed.tools], good, unknown


async def test_the_mcp_server_serves_the_tools_and_records_every_dispatch(tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    async with ToolServer([LOOKUP], record=record) as server:
        names, good, unknown = await _client_calls(server, server.token)
        assert names == ["lookup"]
        assert (good.is_error, good.content[0].text.strip()) == (False, "7431")
        assert unknown.is_error and "unknown tool 'nope'" in unknown.content[0].text
        import httpx2

        async with httpx2.AsyncClient() as http:  # another rollout's token, or none: refused before MCP
            for headers in ({}, {"Authorization": "Bearer not-the-token"}):
                assert (await http.post(server.url, json={}, headers=headers)).status_code == 401
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert [(d["tool"], d["arguments"], d["result"].strip(), d["is_error"]) for d in lines] == [
        ("lookup", {"key": "alpha"}, "7431", False), ("nope", {}, lines[1]["result"], True)]
    assert server.infra_error is None and not Path(server.socket_path).exists()


async def test_a_failing_or_hung_tool_is_the_agents_error_a_missing_one_the_infrastructures(tmp_path: Path) -> None:
    """A call that fails or hangs on the agent's arguments is the tool's answer (scored): were it masked, a
    policy could escape every failing rollout by hanging a tool. One that could never run is infrastructure."""
    failing = TaskTool(name="fails", description="d", command="echo bad input >&2; exit 3")
    hung = TaskTool(name="hangs", description="d", command="sleep 30", timeout_s=0.5)
    absent = TaskTool(name="mail", description="d", service="mail", path="/send")
    async with ToolServer([failing, hung, absent], record=tmp_path / "r.jsonl") as server:
        text, is_error = await server.dispatch("fails", {})
        assert is_error and "exit 3" in text and "bad input" in text and server.infra_error is None
        text, is_error = await server.dispatch("hangs", {})
        assert (is_error, text, server.infra_error) == (True, "error: the tool timed out", None)
    record = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [d.get("failure") for d in record] == [None, "tool hangs: its command ran past 0.5s"]
    async with ToolServer([absent], record=tmp_path / "s.jsonl") as server:
        _, is_error = await server.dispatch("mail", {"to": "x"})
        assert is_error and "service 'mail' is not running" in (server.infra_error or "")


async def test_a_tools_command_has_no_more_reach_than_the_agent(tmp_path: Path, forge_home: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent names what a tool's command reads (issue 43): on the host it was /etc/shadow, the store,
    forge's environment. Confined (sandbox/confine.py) it gets none of them."""
    monkeypatch.setenv("FORGE_TEACHER_API_KEY", "sk-teacher-0d1e2f")
    (forge_home / "secret.txt").write_text("forge's own file\n")
    reads = TaskTool(name="reads", description="d", command=(
        "path=$(python3 -c 'import json,sys; print(json.load(sys.stdin)[\"path\"])'); cat \"$path\" 2>&1; env"))
    async with ToolServer([reads], record=tmp_path / "r.jsonl") as server:
        for path in ("/etc/shadow", str(forge_home / "secret.txt"), str(tmp_path / "r.jsonl"), "/proc/1/environ"):
            text, _ = await server.dispatch("reads", {"path": path})
            assert "root:" not in text and "forge's own file" not in text and '"tool": "reads"' not in text, text
            assert "sk-teacher" not in text and "FORGE_HOME" not in text and "FORGE_TOOL=reads" in text, text


async def test_a_service_tool_forwards_its_arguments_to_the_service(tmp_path: Path) -> None:
    from openforge.engine.serve import serve_in_thread
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    seen: list[tuple[str, Any, str | None]] = []

    async def send(request: Request) -> JSONResponse:
        seen.append((request.method, await request.json(), request.headers.get("x-forge-tool")))
        return JSONResponse({"sent": True}, status_code=200 if seen[-1][1].get("to") else 422)

    service = serve_in_thread(Starlette(routes=[Route("/send", send, methods=["POST"])]))
    try:
        tool = TaskTool(name="send_mail", description="d", service="mail", path="/send")
        async with ToolServer([tool], record=tmp_path / "r.jsonl", services={"mail": service.url}) as server:
            assert await server.dispatch("send_mail", {"to": "bob"}) == ('{"sent":true}', False)
            text, is_error = await server.dispatch("send_mail", {})
            assert is_error and text.startswith("error (HTTP 422)") and server.infra_error is None
    finally:
        service.stop()
    assert seen == [("POST", {"to": "bob"}, "send_mail"), ("POST", {}, "send_mail")]


def test_a_rollouts_dispatch_record_is_kept_under_its_run_on_the_host(forge_home: Path) -> None:
    path = dispatch_record_path("run-1", "ro-1")
    assert path.is_relative_to(forge_home) and "run-1" in path.parts and path.name.startswith("ro-1")
    assert dispatch_record_path("run-1", "ro-2") != path
