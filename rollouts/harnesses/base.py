"""The harness interface: how an agent program is found/installed in a sandbox, run on a task,
pointed at the proxy with its rollout's credential, and how its result is read.

An adapter is small: `prepare` makes the program available inside the sandbox, `command` is the
command line for one task, `env` the environment that points it at the proxy, and `outcome` reads
what the harness itself reported once it has exited: its final answer, or why it failed. The runner
does the rest (timeouts, output capture, killing what the agent left, verification).

An outcome is one of three endings (docs/harnesses.md, "How a rollout ends"):
    answer          graded
    policy failure  the harness stopped on the policy's doing (its turn limit, a context the policy
                    filled): scored 0 without grading, kept in its group and in pass@k
    failure         the harness broke or reported a fault that is not the policy's (an API error of the
                    server's, a crash): `failed`, failure_kind "harness", masked like infrastructure
Neither failure's text ever reaches a verifier. Adapters must read the harness's own structured result
(Claude Code's JSON, Codex's JSON events, OpenClaw's JSON), never guess from free-form output the
policy can write into: a failure it could fake would mask its 0.

What differs between harnesses is declared on the adapter class (`HarnessBase` holds the defaults),
so the runner and preflight never compare harness names:

    calls_model  (True) the harness talks to the model: a rollout in which it made no successful model
                 call is a harness failure too. Only stand-in agents (selfcheck's solution scripts,
                 tests' shell lines) set it False.
    own_browser  (False) it starts its own browser: a GUI task's display gets none, and the page it
                 would have shown comes as FORGE_START_URL.
    gui          (False) it sends screenshots: the policy must be a vision model.
    takes_tools  (False) it takes a task's tools from an MCP server (HarnessContext.tools_url); a spec
                 harness does when its spec has an [mcp] table.
    side_calls   (none) its own background calls (a title, a memory extraction, a compaction summary),
                 named by a regex on a call's opening text or closing user turn: tagged on the call row
                 and, unless `train`, not trained on.
    available(config)  None when this machine has what the harness needs to run in a sandbox that
                 runs host programs (`Sandbox.runs_host_programs`), else the fix to print.
    install(cache)  put it into the harness cache (`forge harness install`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

from openforge.errors import HarnessError, SandboxError
from openforge.rollouts.harnesses.agent_files import ANSWER_FILE
from openforge.sandbox.base import ExecResult, Sandbox

if TYPE_CHECKING:
    from openforge.config import ForgeConfig
    from openforge.rollouts.harnesses.npm import NpmHarness
    from openforge.sandbox.harness_image import VenvLayer

MAX_ANSWER_BYTES = 4 * 1024 * 1024  # an answer longer than this is cut (it fails exact grading anyway)


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
    # The task's tools, when it has any: the rollout's MCP server (streamable HTTP) as the sandbox reaches
    # it, and the bearer token it demands (rollouts/runner/tool_server.py); "" when the task has none.
    tools_url: str = ""
    tools_token: str = ""
    # A multi-step Harbor task's step being run (rollouts/runner/steps.py): each is a fresh harness run
    # given that step's instruction; "" for a task of one step.
    step: str = ""
    # The run's context size as the proxy enforces it (the engine's context length, or
    # proxy.max_context_tokens where lower); None when the proxy reports none.
    context_tokens: int | None = None


@dataclass(frozen=True)
class HarnessOutcome:
    """What a harness reported: its final answer, the policy's failure, or the reason the harness
    failed (exactly one is set)."""

    answer: str | None = None
    failure: str | None = None  # not the policy's doing, e.g. "API error 529: the engine is overloaded"
    policy_failure: str | None = None  # e.g. "claude-code stopped at its turn limit (8 turns)"
    turns: int | None = None  # model turns, where the harness reports them
    # The harness said its conversation no longer fits the context (Claude Code's `blocking_limit`, told the
    # run's context by its spec, stops before it sends): the runner makes it a configuration failure when no
    # answer of the policy's was in it (runner/harness_run.py), the policy's when there was.
    context_full: bool = False

    @classmethod
    def failed(cls, reason: str, *, turns: int | None = None) -> "HarnessOutcome":
        return cls(failure=reason.strip()[:500] or "failed without a reason", turns=turns)

    @classmethod
    def policy_failed(cls, reason: str, *, turns: int | None = None, context_full: bool = False) -> "HarnessOutcome":
        return cls(policy_failure=reason.strip()[:500] or "the policy failed", turns=turns, context_full=context_full)


@dataclass(frozen=True)
class SideCalls:
    """A harness's own background calls, by name: `match` maps a name to a regex searched in a call's
    opening text (its system prompt and first message, `opening_text`) and its closing user turn (where
    Codex asks for its compaction summary, `closing_text`); `train` puts them in the trajectory."""

    match: tuple[tuple[str, str], ...] = ()
    train: bool = False

    def name_of(self, request: object) -> str | None:
        """The name of the first side call whose regex `request` (a recorded request body) opens with, or None."""
        if not self.match or not isinstance(request, dict):
            return None
        text = opening_text(request) + "\n" + closing_text(request)
        return next((name for name, pattern in self.match if re.search(pattern, text, re.MULTILINE)), None)


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts/blocks of any of the three APIs
        return "\n".join(_text_of(part.get("text") or part.get("content") or "") if isinstance(part, dict)
                         else _text_of(part) for part in content)
    return ""


def opening_text(request: dict) -> str:
    """A request body's system prompt (Anthropic's `system`, Responses' `instructions`, a system message)
    and first conversation message, in any of the three APIs: what tells a title call from the agent's."""
    messages = request.get("messages") or request.get("input") or []
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    head = [m for m in messages if isinstance(m, dict)][:2]
    system = [request.get("system"), request.get("instructions")]
    return "\n".join(_text_of(part) for part in [*system, *(m.get("content") for m in head)] if part)


def closing_text(request: dict) -> str:
    """The text the harness itself wrote in a request's last message when that is a user turn: its
    text parts only, never a tool result inside it (the policy's commands write those)."""
    messages = request.get("messages") or request.get("input") or []
    last = messages[-1] if isinstance(messages, list) and messages else None
    if not isinstance(last, dict) or last.get("role") != "user":
        return ""
    content = last.get("content")
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return "\n".join(p["text"] for p in parts if isinstance(p, dict) and p.get("type") in ("text", "input_text")
                     and isinstance(p.get("text"), str))


class Harness(Protocol):
    name: str
    calls_model: bool
    own_browser: bool
    gui: bool
    takes_tools: bool
    side_calls: SideCalls

    @classmethod
    def available(cls, config: "ForgeConfig") -> str | None:
        """None when this machine can run the harness in a host-program sandbox, else the fix."""

    async def prepare(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
        """Make the harness runnable in the sandbox (find it, copy it in, write its config files).
        Raises HarnessError with the fix when it cannot."""

    def command(self, ctx: HarnessContext) -> list[str]:
        """The command line that runs the harness on the task's instruction."""

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        """Environment variables pointing the harness at the proxy with the rollout's credential."""

    async def outcome(self, result: ExecResult, sandbox: Sandbox) -> HarnessOutcome:
        """The harness's final answer or failure, read from its own result (after it has exited)."""


class HarnessBase:
    """The declared capabilities' defaults (see the module docstring); every adapter derives from it."""

    name: ClassVar[str]
    calls_model: ClassVar[bool] = True
    own_browser: ClassVar[bool] = False
    gui: ClassVar[bool] = False
    takes_tools: ClassVar[bool] = False
    side_calls: ClassVar[SideCalls] = SideCalls()

    @classmethod
    def available(cls, config: "ForgeConfig") -> str | None:
        return None  # needs nothing of this machine's (a stand-in agent, a shell line)

    @classmethod
    def install(cls, cache: Path, *, on_line: Callable[[str], None] | None = None) -> str:
        """Put the harness into the harness cache (`forge harness install`; a no-op when it is there) and
        return what runs. HarnessError when it cannot."""
        raise HarnessError(f"harness {cls.name!r} has nothing `forge harness install` can install; "
                           "see docs/harnesses.md for what it needs")

    @classmethod
    def npm_harness(cls) -> "NpmHarness | None":
        """Its npm packages and the executable they put on the PATH, when it is an npm program (what
        `forge sandbox build-image --harness NAME` copies onto the python image); None otherwise."""
        return None

    @classmethod
    def venv_layer(cls, cache: Path) -> "VenvLayer | None":
        """Its installed venv in `cache` as an image layer, when it is a Python program that gets an image
        of its own (`forge sandbox build-image --harness NAME`); None otherwise. HarnessError when it is
        one but is not installed."""
        return None


def last_line(text: str) -> str:
    """The last non-empty line of some output (where a CLI prints its error)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


async def read_text(sandbox: Sandbox, path: str) -> str | None:
    """A text file the harness wrote in the sandbox, or None when it wrote none."""
    try:
        data = await sandbox.read_file(path, max_bytes=MAX_ANSWER_BYTES)
    except SandboxError:  # SandboxFileNotFound, or a path it made unreadable
        return None
    return data.decode("utf-8", errors="replace")


async def answer_file_outcome(result: ExecResult, sandbox: Sandbox, *, name: str) -> HarnessOutcome:
    """For a harness that writes its final answer to ANSWER_FILE and exits 0 (mini, solution scripts):
    a non-zero exit is a failure whatever the file says; exit 0 without the file is an empty answer."""
    if result.exit_code != 0:
        reason = last_line(result.stderr) or last_line(result.stdout) or "no output"
        return HarnessOutcome.failed(f"{name} exited {result.exit_code}: {reason}")
    return HarnessOutcome(answer=await read_text(sandbox, ANSWER_FILE) or "")
