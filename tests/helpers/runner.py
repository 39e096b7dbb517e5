"""The runner tests' shell harness (runs a script as the agent), a task and a runner on the local sandbox."""

from __future__ import annotations

from openforge.config import ForgeConfig
from openforge.store import Store
from openforge.rollouts.harnesses.base import HarnessBase, HarnessContext, HarnessOutcome, answer_file_outcome
from openforge.rollouts.runner.runner import RolloutRunner
from openforge.rollouts.tasks.format import TaskSpec
from openforge.sandbox.base import ExecResult, Sandbox


class ShellHarness(HarnessBase):
    """A stand-in agent: its final answer is what it leaves in the answer file (as `mini` does)."""

    name = "shell"
    calls_model = False  # a shell line asks no model

    def __init__(self, script: str) -> None:
        self.script = script
        self.prepared: list[str] = []

    async def prepare(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
        self.prepared.append(ctx.api_key)

    def command(self, ctx: HarnessContext) -> list[str]:
        return ["sh", "-c", self.script]

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {"OPENAI_API_KEY": ctx.api_key, "OPENAI_BASE_URL": ctx.proxy_url + "/v1"}

    async def outcome(self, result: ExecResult, sandbox: Sandbox) -> HarnessOutcome:
        return await answer_file_outcome(result, sandbox, name=self.name)


def _config(**runner: object) -> ForgeConfig:
    cfg = ForgeConfig()
    cfg.sandbox.start_retries = 2
    cfg.runner.verifier_timeout_s = 10
    for key, value in runner.items():
        setattr(cfg.runner, key, value)
    return cfg


def _task(tid: str = "t", verifier: str = "test -f done.txt", **kw: object) -> TaskSpec:
    return TaskSpec(id=tid, instruction="make done.txt", verifier=verifier, **kw)


def _runner(store: Store, harness: ShellHarness, **kw: object) -> RolloutRunner:
    cfg = kw.pop("config", None) or _config()
    return RolloutRunner(store, config=cfg, proxy_url="http://127.0.0.1:9", harness=harness, **kw)


class Reporting(ShellHarness):
    """A harness whose own result (not a file in the sandbox) says what it answered or why it failed."""

    def __init__(self, script: str, reported: HarnessOutcome, *, calls_model: bool = False) -> None:
        super().__init__(script)
        self.reported, self.calls_model = reported, calls_model

    async def outcome(self, result: ExecResult, sandbox: Sandbox) -> HarnessOutcome:
        return self.reported
