"""Task tools' tests: a call to the per-rollout MCP server and a rollout that uses it."""

from __future__ import annotations

import json
import sys
from typing import Any

from openforge.config import ForgeConfig, HarnessConfig
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import TaskSpec
from openforge.rollouts.tasks.tools import TaskTool

# The tool looks a key up in a table only the host has: the agent cannot know the answer without the call.
LOOKUP = TaskTool(
    name="lookup", description="Look a key up in the order table",
    input_schema={"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
    command=f"{sys.executable} -c 'import json,sys; k=json.load(sys.stdin)[\"key\"]; "
            f"print({{\"alpha\": \"7431\"}}.get(k, \"no such key\"))'")


def call(name: str, arguments: dict[str, Any]) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


async def _rollout(rig: Any, task: TaskSpec, **harness: Any) -> Any:
    config = ForgeConfig()
    config.harness = HarnessConfig(**harness)
    runner = RolloutRunner(rig.store, config=config, proxy_url=rig.url, proxy_socket=rig.proxy.uds)
    [ro] = await runner.run(rig.rollout.run_id, [RolloutSpec(task, 0)])
    return ro
