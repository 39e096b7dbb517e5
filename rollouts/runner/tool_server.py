"""`ToolServer`: one rollout's task tools as an MCP server on the host, every dispatch recorded there.

    async with ToolServer(task.tools, record=path, folder=tmp) as tools:
        url = sb.agent_socket_url(tools.socket_path, tools.url, TOOLS_PORT)   # what the harness is given
        ...                                       # the agent runs; tools.dispatches grows
    # closed: no call can arrive any more; `path` holds one JSON line per dispatch

The server is the real `mcp` package's low-level `Server` over streamable HTTP (JSON responses), on
uvicorn in the runner's own event loop, listening on a unix socket (bound into an isolated sandbox,
where a forwarder serves it on the sandbox's 127.0.0.1) and on an ephemeral loopback port (for a
sandbox that shares the host's network). Both demand `Authorization: Bearer <token>`, a secret made
per rollout, so no other rollout (and nothing else on the host) can call this rollout's tools.

A dispatch runs the tool's handler here, outside the sandbox: `command` (a shell command, confined as a
task's MCP servers are (sandbox/confine.py); the arguments as JSON on stdin; its stdout is the result, a
non-zero exit an error result the agent sees)
or `service` (the arguments as the JSON body of a request to the task service's base URL for this
rollout). A handler that could never run (its command cannot start, its service is not there) is the
infrastructure's failure: the agent gets an error result and `infra_error` is set, so the runner masks
the rollout instead of scoring it. A call that fails on the agent's arguments (the command runs past
`timeout_s`, the service or a task MCP server does not answer it or dies on it) is the tool's answer to
that call: the agent gets an error result, the record keeps why (`failure`), and the rollout is scored.
Masking those would hand the policy a way out of every failing rollout: hang or crash a tool. A task's
own MCP servers (`mcp_servers`, Harbor's `[[environment.mcp_servers]]`) have their tools listed beside
these and their calls carried out by mcp_upstream.py's client sessions: the same record (with the
server's name), the same route in.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import socket
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from openforge.rollouts.runner.mcp_upstream import McpUpstreams, UpstreamFailed
from openforge.rollouts.tasks.mcp_servers import McpServerSpec
from openforge.rollouts.tasks.tools import RESERVED_NAMES, TaskTool
from openforge.sandbox.confine import Confinement, ConfinementUnavailable
from openforge.sandbox.gc import owned_tempdir, remove_owned

RESULT_CHARS = 64_000  # what one result may carry back to the agent (and into the record)
MCP_PATH = "/mcp"
# Each forwarded call names its tool; the services' record keeps it (contract with rollouts/tasks/services.py).
TOOL_HEADER = "X-Forge-Tool"
SERVER_NAME = "forge"  # the name harnesses show the tools under (mcp__forge__<tool> in Claude Code)


def dispatch_record_path(run_id: str, rollout_id: str) -> Path:
    """Where the host keeps a rollout's record of tool dispatches: $FORGE_HOME/runs/<run>/tools/<rollout>.jsonl."""
    from openforge.paths import forge_home, runs_dir

    return runs_dir(forge_home()) / run_id / "tools" / f"{rollout_id}.jsonl"


class ToolServerUnavailable(Exception):
    """The `mcp` package is missing or the server would not start: an infrastructure failure."""


def _clip(text: str) -> str:
    return text if len(text) <= RESULT_CHARS else text[:RESULT_CHARS] + f"\n[... {len(text) - RESULT_CHARS} characters cut]"


class ToolServer:
    """One rollout's MCP server; an async context manager (start, then close on every path)."""

    def __init__(self, tools: list[TaskTool], *, record: Path, services: Mapping[str, str] | None = None,
                 folder: Path | None = None, mcp_servers: list[McpServerSpec] | None = None,
                 confinement: Confinement | None = None) -> None:
        self.tools = {tool.name: tool for tool in tools}
        # How the task's own code runs (its MCP servers, its tools' commands): the run's, else bubblewrap.
        self.confinement = confinement
        # The task's own MCP servers (Harbor's mcp_servers): their tools are offered here beside `tools`.
        self.upstreams = McpUpstreams(mcp_servers, services=services, folder=folder,
                                      confinement=confinement) if mcp_servers else None
        self.record = record
        self.services = dict(services or {})
        self.token = secrets.token_urlsafe(32)
        self.dispatches: list[dict[str, Any]] = []
        self.infra_error: str | None = None
        # A short folder: a unix socket's path must fit in 108 bytes.
        self._folder = Path(owned_tempdir("forge-mcp-", dir=folder))  # `forge gc` sweeps it after a crash
        self.socket_path = str(self._folder / "mcp.sock")
        self.url = ""
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    async def __aenter__(self) -> "ToolServer":
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        try:
            import uvicorn
            from mcp.server.lowlevel import Server
        except ImportError as exc:
            raise ToolServerUnavailable(f"task tools need the `mcp` package: pip install 'openforge[tools]' ({exc})") from None
        if self.confinement is None and any(t.command is not None for t in self.tools.values()):
            try:
                self.confinement = Confinement.required()
            except ConfinementUnavailable as exc:
                raise ToolServerUnavailable(f"the task's tool commands cannot run here: {exc}") from None
        if self.upstreams is not None:
            try:
                await self.upstreams.start()
            except UpstreamFailed as exc:
                raise ToolServerUnavailable(str(exc)) from None
            if clash := sorted(set(self.upstreams.tools) & (set(self.tools) | RESERVED_NAMES)):
                raise ToolServerUnavailable(f"MCP server {self.upstreams.tools[clash[0]][0]}: its tool {clash[0]!r} "
                                            "is also a task tool or one of mini's own")

        class _Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                yield  # the runner's process owns its signals (Ctrl-C stops the run, not this server)

        server = Server(SERVER_NAME, on_list_tools=self._list_tools, on_call_tool=self._call_tool)
        app = server.streamable_http_app(streamable_http_path=MCP_PATH, json_response=True, host="127.0.0.1")
        self.record.parent.mkdir(parents=True, exist_ok=True)
        self.record.write_text("")
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unix.bind(self.socket_path)
        os.chmod(self.socket_path, 0o600)
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        tcp.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{tcp.getsockname()[1]}{MCP_PATH}"
        self._server = _Server(uvicorn.Config(_BearerGate(app, self.token), log_level="warning", access_log=False,
                                              lifespan="on", timeout_graceful_shutdown=2))
        self._task = asyncio.create_task(self._serve([unix, tcp]))
        deadline = time.monotonic() + 10
        while not self._server.started:
            if self._task.done() or time.monotonic() > deadline:
                raise ToolServerUnavailable("the task's MCP server did not start")
            await asyncio.sleep(0.01)

    async def _serve(self, sockets: list[socket.socket]) -> None:
        try:
            await self._server.serve(sockets=sockets)
        except SystemExit:  # uvicorn's way of saying the app's startup failed
            pass
        finally:
            for sock in sockets:
                sock.close()

    async def close(self) -> None:
        """Stop serving (no dispatch can arrive after this returns) and remove the socket's folder."""
        if self._task is not None and not self._task.done():
            self._server.should_exit = True
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout=5)
            except TimeoutError:
                self._server.force_exit = True
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._task
        if self.upstreams is not None:
            await self.upstreams.close()
        remove_owned(self._folder)

    # -- MCP handlers ---------------------------------------------------------------------------------

    async def _list_tools(self, ctx: Any, params: Any) -> Any:
        import mcp_types as types

        # An upstream tool's output schema is not passed on: the result reaches the agent as text only.
        upstream = [types.Tool(name=t.name, description=t.description, input_schema=t.input_schema)
                    for _, t in (self.upstreams.tools.values() if self.upstreams is not None else [])]
        return types.ListToolsResult(tools=[
            types.Tool(name=t.name, description=t.description, input_schema=t.input_schema)
            for t in self.tools.values()] + upstream)

    async def _call_tool(self, ctx: Any, params: Any) -> Any:
        import mcp_types as types

        arguments = dict(params.arguments or {})
        result, is_error = await self.dispatch(params.name, arguments)
        return types.CallToolResult(content=[types.TextContent(type="text", text=result)], is_error=is_error)

    async def dispatch(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """Run one call's handler and record it: (result text, whether it is an error result)."""
        started = time.time()
        tool = self.tools.get(name)
        infra, failure, server = None, None, None
        if tool is None and self.upstreams is not None and name in self.upstreams.tools:
            server = self.upstreams.tools[name][0]
            try:
                result, is_error = await self.upstreams.call(name, arguments)
            except UpstreamFailed as exc:  # it listed its tools, then failed this call: its answer to it
                result, is_error, failure = "error: the tool's MCP server failed", True, str(exc)
        elif tool is None:
            names = [*self.tools, *(self.upstreams.tools if self.upstreams is not None else {})]
            result, is_error = f"error: unknown tool {name!r}; the tools are {', '.join(names)}", True
        elif tool.command is not None:
            result, is_error, infra, failure = await self._run_command(tool, arguments)
        else:
            result, is_error, infra, failure = await self._call_service(tool, arguments)
        if infra is not None and self.infra_error is None:
            self.infra_error = infra
        entry = {"seq": len(self.dispatches), "time": started, "tool": name, "arguments": arguments,
                 "result": _clip(result), "is_error": is_error, "infra_error": infra,
                 **({"failure": failure} if failure else {}),
                 "duration_s": round(time.time() - started, 4), **({"server": server} if server else {})}
        self.dispatches.append(entry)
        with self.record.open("a", encoding="utf-8") as f:  # a line per dispatch: a crash keeps what came before
            f.write(json.dumps(entry) + "\n")
        return _clip(result), is_error

    async def _run_command(self, tool: TaskTool, arguments: dict[str, Any]) -> tuple[str, bool, str | None, str | None]:
        """(result, is_error, why it could never run: infra, why this call failed: the agent's)."""
        assert tool.command is not None
        assert self.confinement is not None
        folder = self._folder / "tool"  # beside the server's socket, never the folder that holds it
        try:
            folder.mkdir(mode=0o700, exist_ok=True)
            argv, env = self.confinement.command(["/bin/sh", "-c", tool.command], str(folder),
                                                 env={"FORGE_TOOL": tool.name})
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=env, cwd=folder, start_new_session=True)
        except OSError as exc:
            return "error: the tool could not run", True, f"tool {tool.name}: cannot start its command: {exc}", None
        try:
            out, err = await asyncio.wait_for(proc.communicate(json.dumps(arguments).encode()), tool.timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            await proc.wait()
            return "error: the tool timed out", True, None, f"tool {tool.name}: its command ran past {tool.timeout_s:g}s"
        text = out.decode("utf-8", "replace")
        if proc.returncode != 0:
            why = err.decode("utf-8", "replace").strip()[-2000:]
            return f"error (exit {proc.returncode}): {text}{why}".strip(), True, None, None
        return text, False, None, None

    async def _call_service(self, tool: TaskTool, arguments: dict[str, Any]) -> tuple[str, bool, str | None, str | None]:
        import httpx

        assert tool.service is not None
        base = self.services.get(tool.service)
        if base is None:
            return (f"error: service {tool.service!r} is not available", True,
                    f"tool {tool.name}: service {tool.service!r} is not running for this rollout", None)
        try:
            async with httpx.AsyncClient(timeout=tool.timeout_s) as client:
                response = await client.request(tool.method, base.rstrip("/") + tool.path,
                                                 headers={TOOL_HEADER: tool.name},
                                                 **({"params": arguments} if tool.method == "GET" else {"json": arguments}))
        except httpx.HTTPError as exc:  # it passed its health check at the start: this call is what it failed
            return (f"error: service {tool.service!r} did not answer", True, None,
                    f"tool {tool.name}: service {tool.service!r} failed: {type(exc).__name__}: {exc}")
        if response.status_code >= 400:
            return f"error (HTTP {response.status_code}): {response.text}", True, None, None
        return response.text, False, None, None


class _BearerGate:
    """ASGI middleware: every request must carry the rollout's token (`Authorization: Bearer ...`)."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not secrets.compare_digest(given, self.expected):
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"text/plain")]})
                await send({"type": "http.response.body", "body": b"missing or wrong bearer token\n"})
                return
        await self.app(scope, receive, send)
