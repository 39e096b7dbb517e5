"""The `mini` agent's Python adapter: copies mini_agent.py into the sandbox and runs it with a python that
has the `openai` package (the local backend: this venv's interpreter; container backends: the image's
`python3`). The harness named `mini` runs from its spec (specs/mini.toml) instead; this class stays as
the reference bench/ compares the spec-driven mini against."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from openforge.config import ForgeConfig, HarnessConfig
from openforge.rollouts.harnesses.base import HarnessBase, HarnessContext, HarnessOutcome, answer_file_outcome
from openforge.rollouts.harnesses import agent_files
from openforge.rollouts.harnesses.mini_agent import CONTEXT_FULL
from openforge.sandbox.base import ExecResult, Sandbox

AGENT_SOURCE = Path(__file__).with_name("mini_agent.py")
AGENT_PATH = ".forge/mini_agent.py"  # relative to the sandbox's working directory
INSTRUCTION_PATH = ".forge/instruction.txt"  # a file, not argv: instructions can be long or odd


class MiniHarness(HarnessBase):
    """Copies mini_agent.py into the sandbox and runs it against the proxy's Chat Completions API."""

    name = "mini"

    @classmethod
    def available(cls, config: ForgeConfig) -> str | None:
        if importlib.util.find_spec("openai") is None:
            return f"the mini harness needs the `openai` package in {sys.executable}: pip install openai"
        return None

    def __init__(self, config: HarnessConfig) -> None:
        self.config = config

    async def prepare(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
        await sandbox.write_file(AGENT_PATH, AGENT_SOURCE.read_bytes())
        await sandbox.write_file(agent_files.SANDBOX_PATH, agent_files.SOURCE.read_bytes())
        await sandbox.write_file(INSTRUCTION_PATH, ctx.instruction.encode("utf-8"))

    def command(self, ctx: HarnessContext) -> list[str]:
        python = sys.executable if ctx.backend == "local" else "python3"
        return [python, AGENT_PATH, "--instruction-file", INSTRUCTION_PATH,
                "--max-turns", str(self.config.max_turns), "--max-tokens", str(self.config.max_tokens),
                *self.config.extra_args]

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        # A GUI sandbox sets DISPLAY itself (it runs the display); it is not set here.
        return {
            "OPENAI_BASE_URL": ctx.proxy_url.rstrip("/") + "/v1",
            "OPENAI_API_KEY": ctx.api_key,
            "FORGE_MODEL": ctx.model,
            "PYTHONUNBUFFERED": "1",  # a killed agent still leaves its log in the stored stdout
            "PYTHONDONTWRITEBYTECODE": "1",
        }

    async def outcome(self, result: ExecResult, sandbox: Sandbox) -> HarnessOutcome:
        # mini_agent writes its final answer to the answer file and exits 3 when the API failed it,
        # 4 without `openai`, 5 on its own bug: any of those is a failure, never an answer; 6 when the
        # conversation outgrew the context: the policy's failure.
        if result.exit_code == CONTEXT_FULL:
            return HarnessOutcome.policy_failed(f"{self.name} exited {CONTEXT_FULL}: the conversation outgrew "
                                                "the model's context")
        return await answer_file_outcome(result, sandbox, name=self.name)
