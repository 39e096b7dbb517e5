"""The harness interface: how an agent program is found/installed in a sandbox, run on a task, and
pointed at the proxy with its rollout's credential.

An adapter is small: `prepare` makes the program available inside the sandbox, `command` is the
command line for one task, `env` the environment that points it at the proxy. The runner does the
rest (timeouts, output capture, verification).

Optional: `final_answer(stdout: str) -> str | None`, the harness's final answer read from its stdout
(e.g. the `result` of Claude Code's JSON). After the harness exits, a runner that finds no
`.forge/answer.txt` (rollouts.tasks.ANSWER_FILE) writes this there, or else the tail of stdout, so
tasks that grade the answer work with every harness. `mini` writes the file itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sandbox.base import Sandbox


@dataclass
class HarnessContext:
    """What an adapter knows about the rollout it runs."""

    proxy_url: str  # base URL of the proxy as seen from inside the sandbox, e.g. http://127.0.0.1:8700
    api_key: str  # the rollout's credential
    model: str  # the model id the proxy serves (ProxyConfig.served_model_name)
    instruction: str  # the task's instruction text
    workdir: str  # the sandbox's working directory
    backend: str = "local"  # the sandbox backend (SandboxInfo.backend): local | docker | kubernetes
    task_id: str = ""  # the task's id (for logs and labels; the agent is told only the instruction)


class Harness(Protocol):
    name: str

    async def prepare(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
        """Make the harness runnable in the sandbox (find it, copy it in, write its config files).
        Raises HarnessError with the fix when it cannot."""

    def command(self, ctx: HarnessContext) -> list[str]:
        """The command line that runs the harness on the task's instruction."""

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        """Environment variables pointing the harness at the proxy with the rollout's credential."""
