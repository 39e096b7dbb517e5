"""`McpUpstreams`: one rollout's client sessions to the task's own MCP servers (rollouts/tasks/mcp_servers.py).

    upstreams = McpUpstreams(task.mcp_servers, services=services.urls(), folder=tmp)
    await upstreams.start()              # each server started (stdio) or reached (its service's front)
    upstreams.tools                      # {tool name: (server name, mcp Tool)}
    text, is_error = await upstreams.call("get_code", {})
    await upstreams.close()              # the stdio servers' processes are gone when it returns

The ToolServer (tool_server.py) offers these tools beside the task's own and sends each call here, so
the harness reaches a task's MCP server only through the rollout's bearer-gated tool server, and every
call is in the host's dispatch record. A stdio server runs in a fresh 0700 folder holding its files,
confined (sandbox/confine.py: a bubblewrap sandbox of its own, no network, its folder at /task, an
environment of PATH, LANG, HOME, TMPDIR and the task's `env` only): the agent's arguments drive it, so it
reaches no more than the agent does. One over HTTP is reached at its task service's recording front, so its requests are recorded
there too. The sessions live in one task of their own: the `mcp` client's transports are anyio task
groups, which must be left from the task that entered them (the runner closes from a shielded task).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from openforge.rollouts.tasks.mcp_servers import McpServerSpec
from openforge.sandbox.confine import Confinement, ConfinementUnavailable
from openforge.sandbox.gc import owned_tempdir, remove_owned


class UpstreamFailed(Exception):
    """A task MCP server would not start, list its tools, or answer a call: an infrastructure failure."""


def _text(result: Any) -> str:
    """A CallToolResult's content as the text the agent gets (non-text parts named, not dropped silently)."""
    parts = []
    for item in getattr(result, "content", None) or []:
        text = getattr(item, "text", None)
        parts.append(text if isinstance(text, str) else f"[{getattr(item, 'type', 'content')} content]")
    return "\n".join(parts)


class McpUpstreams:
    """The client side of a rollout's task MCP servers."""

    def __init__(self, specs: list[McpServerSpec], *, services: Mapping[str, str] | None = None,
                 folder: Path | None = None, confinement: Confinement | None = None) -> None:
        self.specs = {s.name: s for s in specs}
        self.confinement = confinement  # the run's (Confinement.for_sandbox); None: bubblewrap, or refused
        self.services = dict(services or {})
        self.tools: dict[str, tuple[str, Any]] = {}
        self._sessions: dict[str, Any] = {}
        self._folder = Path(owned_tempdir("forge-mcpup-", dir=folder))  # `forge gc` sweeps it after a crash
        self._stop = asyncio.Event()
        self._ready: asyncio.Future[None] | None = None
        self._owner: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start or reach every server, initialise it and list its tools; UpstreamFailed says which and why."""
        if self.confinement is None:
            try:
                self.confinement = Confinement.required()
            except ConfinementUnavailable as exc:
                raise UpstreamFailed(f"the task's MCP servers cannot run here: {exc}") from None
        self._ready = asyncio.get_running_loop().create_future()
        self._owner = asyncio.create_task(self._own())
        timeout = max((s.ready_timeout_s for s in self.specs.values()), default=1.0) + 5
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), timeout)
        except TimeoutError:
            raise UpstreamFailed(f"the task's MCP servers did not list their tools within {timeout:g}s") from None

    async def _own(self) -> None:
        assert self._ready is not None
        try:
            async with contextlib.AsyncExitStack() as stack:
                for spec in self.specs.values():
                    await self._open(stack, spec)
                self._ready.set_result(None)
                await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001 - reported to start(), or ended by close()
            if not self._ready.done():
                why = exc if isinstance(exc, UpstreamFailed) else UpstreamFailed(_why(exc))
                self._ready.set_exception(why)
            if isinstance(exc, asyncio.CancelledError):
                raise

    async def _open(self, stack: contextlib.AsyncExitStack, spec: McpServerSpec) -> None:
        from mcp.client.session import ClientSession

        try:
            streams = await stack.enter_async_context(self._transport(spec))
            session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
            await asyncio.wait_for(session.initialize(), spec.ready_timeout_s)
            listed = await asyncio.wait_for(session.list_tools(), spec.ready_timeout_s)
        except UpstreamFailed:
            raise
        except BaseException as exc:  # noqa: BLE001 - anyio wraps a transport's failure in an ExceptionGroup
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise UpstreamFailed(f"MCP server {spec.name}: {_why(exc)}{self._stderr(spec)}") from None
        for tool in listed.tools:
            if tool.name in self.tools:
                raise UpstreamFailed(f"MCP server {spec.name}: tool {tool.name!r} is also served by "
                                     f"{self.tools[tool.name][0]}")
            self.tools[tool.name] = (spec.name, tool)
        self._sessions[spec.name] = session

    def _transport(self, spec: McpServerSpec) -> Any:
        if spec.transport == "stdio":
            from mcp.client.stdio import StdioServerParameters, stdio_client

            folder = self._folder / spec.name
            folder.mkdir(mode=0o700)
            for rel, content in spec.files.items():
                (folder / rel).parent.mkdir(parents=True, exist_ok=True)
                (folder / rel).write_text(content, encoding="utf-8")
            assert spec.command is not None
            # The interpreter forge runs under, as for task services (ClawEval's mock services do the same).
            command = sys.executable if spec.command in ("python", "python3") else spec.command
            assert self.confinement is not None
            argv, env = self.confinement.command([command, *spec.args], str(folder), env=spec.env)
            errlog = open(self._folder / f"{spec.name}.stderr", "w", encoding="utf-8")  # noqa: SIM115
            return _closing(stdio_client(StdioServerParameters(command=argv[0], args=argv[1:], env=env,
                                                               cwd=str(folder)), errlog=errlog), errlog)
        base = self.services.get(spec.service or "")
        if base is None:
            raise UpstreamFailed(f"MCP server {spec.name}: service {spec.service!r} is not running for this rollout")
        url = base.rstrip("/") + spec.path
        if spec.transport == "sse":
            from mcp.client.sse import sse_client

            return sse_client(url)
        from mcp.client.streamable_http import streamable_http_client

        return streamable_http_client(url)

    def _stderr(self, spec: McpServerSpec) -> str:
        try:
            tail = (self._folder / f"{spec.name}.stderr").read_text(encoding="utf-8", errors="replace")[-400:].strip()
        except OSError:
            return ""
        return f" (stderr: {tail})" if tail else ""

    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """Carry one call out on the server that lists `name`: (result text, whether it is an error result).
        UpstreamFailed when the server does not answer within its timeout or the session broke."""
        server, _ = self.tools[name]
        spec = self.specs[server]
        try:
            result = await asyncio.wait_for(self._sessions[server].call_tool(name, arguments), spec.timeout_s)
        except TimeoutError:
            raise UpstreamFailed(f"MCP server {server}: tool {name} ran past {spec.timeout_s:g}s") from None
        except Exception as exc:  # noqa: BLE001 - a protocol error or a dead server: not the agent's doing
            raise UpstreamFailed(f"MCP server {server}: tool {name} failed: {_why(exc)}") from None
        return _text(result), bool(getattr(result, "is_error", False))

    async def close(self) -> None:
        """End every session (a stdio server's process with it) and remove the servers' folder."""
        self._stop.set()
        if self._owner is not None and not self._owner.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._owner), timeout=10)
            except TimeoutError:
                self._owner.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._owner
        remove_owned(self._folder)


@contextlib.asynccontextmanager
async def _closing(transport: Any, errlog: Any) -> Any:
    try:
        async with transport as streams:
            yield streams
    finally:
        errlog.close()


def _why(exc: BaseException) -> str:
    """One line for an exception, an ExceptionGroup's first leaf included."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}".strip()[:300]
