"""Claude Code (`@anthropic-ai/claude-code`) as a harness: the spec specs/claude-code.toml says how it
runs (`claude -p` against the proxy's Anthropic Messages API); this hook finds its native binary and
reads its result. The wire protocol it speaks is written down in docs/harnesses.md.

Its final JSON (`{"type": "result", "is_error": false, "result": ..., "num_turns": ...}`) lands in
the rollout's stdout; `outcome` reads it: `result` is the answer only when `is_error` is false. An error
is the policy's when Claude Code's `terminal_reason` (why its loop ended) says the policy ended it: its
turn limit (`--max-turns`, subtype `error_max_turns`) or a conversation grown past the context (the
proxy's 400 "prompt is too long", or its own `blocking_limit` under the context its spec tells it; before any
answer of the policy's, the runner makes that a configuration failure: runner/harness_run.py). Any other error (`api_error_status` 5xx, a connection error) is a
harness failure. The policy's own text is only ever in `result`, never in these fields.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from openforge.rollouts.harnesses.base import HarnessOutcome, last_line
from openforge.rollouts.harnesses.npm import find_package_bin
from openforge.rollouts.harnesses.spec_harness import SpecHarness
from openforge.sandbox.base import ExecResult, Sandbox


# `terminal_reason`s (Claude Code 2.1's enum) for a conversation the policy grew past the context: the
# proxy refused the prompt as too long, or Claude Code's own context limit stopped it.
POLICY_CONTEXT_ENDINGS = ("prompt_too_long", "blocking_limit")


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
        ending = final.get("terminal_reason")
        if final.get("subtype") == "error_max_turns" or ending == "max_turns":
            errors = final.get("errors") if isinstance(final.get("errors"), list) else []
            detail = errors[-1] if errors and isinstance(errors[-1], str) else f"{turns} turns"
            return HarnessOutcome.policy_failed(f"claude-code stopped at its turn limit: {detail}", turns=turns)
        status = final.get("api_error_status")
        head = f"API error {status}" if status else f"claude-code reported an error ({final.get('subtype', '?')})"
        detail = text.removeprefix("API Error: ").removeprefix(f"{status} ").strip() if text else ""
        reason = f"{head}: {detail}" if detail else head
        if ending in POLICY_CONTEXT_ENDINGS:
            return HarnessOutcome.policy_failed(reason, turns=turns, context_full=True)
        return HarnessOutcome.failed(reason, turns=turns)
    if result.exit_code != 0:
        return HarnessOutcome.failed(f"claude-code exited {result.exit_code} after a result", turns=turns)
    return HarnessOutcome(answer=text, turns=turns)


class ClaudeCodeHarness(SpecHarness):
    """The hook specs/claude-code.toml names."""

    @classmethod
    def local_program(cls, cache: Path) -> str | None:
        found = find_package_bin(cache, "claude-code", cls.npm_harness())  # None while .bin/claude is npm's stub
        return str(found) if found else None

    async def outcome(self, result: ExecResult, sandbox: Sandbox) -> HarnessOutcome:
        return claude_outcome(result)
