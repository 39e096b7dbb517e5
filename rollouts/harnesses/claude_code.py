"""Claude Code (`@anthropic-ai/claude-code`) as a harness: `claude -p` against the proxy's Anthropic
Messages API. The wire protocol it speaks is written down in docs/harnesses.md.

    claude -p --output-format json --dangerously-skip-permissions --max-turns N --model M -- "<task>"

Its final JSON (`{"type": "result", "is_error": false, "result": ..., "num_turns": ...}`) lands in
the rollout's stdout; `outcome` reads it: `result` is the answer only when `is_error` is false, and an
API error (`api_error_status`, e.g. the proxy's 400 for a prompt over the context) is a failure.
"""

from __future__ import annotations

import json
from typing import Any

from openforge.config import HarnessConfig
from openforge.rollouts.harnesses.base import HarnessContext, HarnessOutcome, last_line
from openforge.rollouts.harnesses.npm import NpmPackageHarness, check_in_sandbox, npm_cache_dir, sandbox_executable
from openforge.sandbox.base import ExecResult, Sandbox

# Settings that keep Claude Code talking to the proxy only (checked with strace: no DNS, no other
# connection) and let it run unattended.
QUIET_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    # Off: its system prompt would open with `x-anthropic-billing-header: cc_version=<version>.<hash
    # of the first user message>`, so rollouts of different tasks share no prompt prefix (the engine's
    # prefix cache and the trainer's shared-prefix step could not reuse their ~48k-token tools part).
    "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
    # --dangerously-skip-permissions refuses to run as root unless told it is inside a sandbox;
    # a bubblewrap sandbox runs as uid 0 of its user namespace, and the rollout's sandbox is exactly that.
    "IS_SANDBOX": "1",
}


def final_json(stdout: str) -> dict[str, Any] | None:
    """The `{"type": "result", ...}` object `claude -p --output-format json` prints last, if any."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and obj.get("type") == "result":
            return obj
    return None


def claude_outcome(result: ExecResult) -> HarnessOutcome:
    """Claude Code's own verdict on the run, from its final JSON."""
    final = final_json(result.stdout)
    if final is None:
        why = last_line(result.stderr) or last_line(result.stdout) or "no output"
        return HarnessOutcome.failed(f"claude-code exited {result.exit_code} without its result JSON: {why}")
    turns = final.get("num_turns") if isinstance(final.get("num_turns"), int) else None
    text = final.get("result") if isinstance(final.get("result"), str) else ""
    if final.get("is_error") is not False:
        status = final.get("api_error_status")
        head = f"API error {status}" if status else f"claude-code reported an error ({final.get('subtype', '?')})"
        detail = text.removeprefix("API Error: ").removeprefix(f"{status} ").strip() if text else ""
        return HarnessOutcome.failed(f"{head}: {detail}" if detail else head, turns=turns)
    if result.exit_code != 0:
        return HarnessOutcome.failed(f"claude-code exited {result.exit_code} after a result", turns=turns)
    return HarnessOutcome(answer=text, turns=turns)


class ClaudeCodeHarness(NpmPackageHarness):
    name = "claude-code"

    def __init__(self, config: HarnessConfig) -> None:
        self.config = config
        self.cache = npm_cache_dir(config)

    async def prepare(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
        # HOME is the sandbox's own (local: <sandbox>/home; containers: fresh per rollout), so
        # ~/.claude.json and ~/.claude/ never carry anything from one rollout to the next.
        await check_in_sandbox(sandbox, ctx, self.name, self.cache)

    def command(self, ctx: HarnessContext) -> list[str]:
        return [*sandbox_executable(ctx, self.name, self.cache), "-p", "--output-format", "json",
                "--dangerously-skip-permissions", "--max-turns", str(self.config.max_turns),
                "--model", ctx.model, "--no-session-persistence", *self.config.extra_args,
                "--", ctx.instruction]  # `--`: an instruction that starts with "-" is not an option

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {
            **QUIET_ENV,
            # The SDK appends /v1/messages itself: the base URL has no /v1.
            "ANTHROPIC_BASE_URL": ctx.proxy_url.rstrip("/"),
            "ANTHROPIC_API_KEY": ctx.api_key,  # sent as x-api-key
            # Not seen in `-p` runs, but any side request (titles, compaction summaries) then names
            # the served model rather than a Claude model the proxy does not serve.
            "ANTHROPIC_MODEL": ctx.model,
            "ANTHROPIC_SMALL_FAST_MODEL": ctx.model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": ctx.model,
        }

    async def outcome(self, result: ExecResult, sandbox: Sandbox) -> HarnessOutcome:
        return claude_outcome(result)
