"""What a task's tools cost per rollout (rollouts/tasks/tools.py, rollouts/runner/tool_server.py).

1. Per-rollout overhead: the same `mini` rollout (one write_file call, then the answer) through
   RolloutRunner -> local sandbox (bubblewrap where it works) -> the real proxy -> a scripted engine, for
   a task without tools (the baseline) and the same task with one command tool declared: the MCP server
   started on the host, its socket forwarded into the sandbox, mini's MCP session (initialize +
   tools/list), the server closed and its record copied in for the grader. The agent does not call the
   tool, so the figure is the fixed cost of having tools. Rounds alternate between the two (load on a
   shared machine falls on both alike); figures are medians, one rollout at a time, and their ratio.
2. One dispatch: `tools/call` of a command tool through the real `mcp` client over streamable HTTP on
   loopback (the tool's own work is one `cat`), median milliseconds, beside the same handler called
   directly (a shell and `cat` started per call): their difference is what MCP and HTTP add.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path


async def _dispatch_ms(calls: int) -> tuple[list[float], list[float]]:
    """(milliseconds of a tools/call through the MCP client, of the same handler run directly)."""
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    from openforge.rollouts.runner.tool_server import ToolServer
    from openforge.rollouts.tasks.tools import TaskTool

    echo = TaskTool(name="echo", description="echo the arguments", command="cat")
    with tempfile.TemporaryDirectory() as tmp:
        async with ToolServer([echo], record=Path(tmp) / "record.jsonl") as server:
            async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {server.token}"}) as http:
                async with streamable_http_client(server.url, http_client=http) as streams:
                    async with ClientSession(streams[0], streams[1]) as session:
                        await session.initialize()
                        out, direct = [], []
                        for i in range(calls + 3):  # alternating, so load falls on both alike
                            t0 = time.perf_counter()
                            await session.call_tool("echo", {"i": i})
                            out.append((time.perf_counter() - t0) * 1000)
                            t0 = time.perf_counter()
                            await server.dispatch("echo", {"i": i})
                            direct.append((time.perf_counter() - t0) * 1000)
    return out[3:], direct[3:]  # the first calls warm the path


def run(quick: bool = False) -> dict:
    from openforge.rollouts.runner.runner import RolloutRunner
    from openforge.rollouts.tasks.format import load_tasks
    from openforge.rollouts.tasks.tools import TaskTool
    from openforge.sandbox.local import bwrap_usable

    from bench.mini_rig import alternate, mini_rig, rollout_seconds

    rounds, per_round = (3, 2) if quick else (7, 4)
    with mini_rig() as rig:
        plain = next(t for t in load_tasks("builtin") if t.id == "med-create-file")
        lookup = TaskTool(name="lookup", description="look a key up", command="cat",
                          input_schema={"type": "object", "properties": {"key": {"type": "string"}}})
        tasks = {"plain": plain, "tools": plain.model_copy(update={"tools": [lookup]})}
        runner = RolloutRunner(rig.store, config=rig.config, proxy_url=rig.proxy.url, proxy_socket=rig.proxy.uds)
        for task in tasks.values():  # warm: imports, the first sandbox, the first MCP server
            rollout_seconds(rig.store, runner, task)
        times = alternate({name: (lambda t=task: rollout_seconds(rig.store, runner, t)) for name, task in tasks.items()},
                          rounds=rounds, per_round=per_round)
    dispatch, handler = asyncio.run(_dispatch_ms(30 if quick else 200))
    plain_ms, tools_ms = (statistics.median(times[n]) * 1000 for n in ("plain", "tools"))
    result = {
        "rollouts_each": len(times["plain"]),
        "isolation": "bwrap" if bwrap_usable() else "none",
        "plain_ms_per_rollout": round(plain_ms, 1),
        "tools_ms_per_rollout": round(tools_ms, 1),
        "tools_added_ms_per_rollout": round(tools_ms - plain_ms, 1),
        "tools_vs_plain_ratio": round(tools_ms / plain_ms, 3),
        "dispatches": len(dispatch),
        "dispatch_p50_ms": round(statistics.median(dispatch), 2),
        "handler_only_p50_ms": round(statistics.median(handler), 2),
        "mcp_added_p50_ms": round(statistics.median(dispatch) - statistics.median(handler), 2),
    }
    print(f"task_tools: a mini rollout with an MCP tools server {result['tools_ms_per_rollout']} ms vs "
          f"{result['plain_ms_per_rollout']} ms without ({result['tools_vs_plain_ratio']}x, +"
          f"{result['tools_added_ms_per_rollout']} ms, median of {result['rollouts_each']} each, "
          f"{result['isolation']} sandbox); one tools/call {result['dispatch_p50_ms']} ms p50 "
          f"({result['dispatches']} calls; the handler alone {result['handler_only_p50_ms']} ms)")
    return result


if __name__ == "__main__":
    run(quick=True)
