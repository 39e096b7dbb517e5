"""The red team's adversarial agent: a scripted policy that tries to get reward without doing the task."""

from __future__ import annotations

from openforge.rollouts.harnesses.base import HarnessBase, HarnessContext, HarnessOutcome, answer_file_outcome
from openforge.sandbox.base import ExecResult, Sandbox


class Agent(HarnessBase):
    """The policy's shell line as a harness (its answer is what it leaves in the answer file)."""

    name = "shell"
    calls_model = False

    def __init__(self, script: str, env: dict[str, str] | None = None) -> None:
        self.script, self._env = script, env or {}

    async def prepare(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
        return None

    def command(self, ctx: HarnessContext) -> list[str]:
        return ["sh", "-c", self.script]

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return self._env

    async def outcome(self, result: ExecResult, sandbox: Sandbox) -> HarnessOutcome:
        return await answer_file_outcome(result, sandbox, name=self.name)
