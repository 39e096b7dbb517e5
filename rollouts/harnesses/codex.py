"""Codex CLI (`@openai/codex`) as a harness: the spec specs/codex.toml says how it runs (`codex exec`
with a provider entry on the proxy's Responses API, given as `-c` overrides so no config file is
needed); this hook runs its native binary and reads how it ended. Wire protocol: docs/harnesses.md.

Its final message is written by Codex itself to LAST_MESSAGE (`--output-last-message`); `outcome`
reads that file. A run that exits non-zero ended on the error of its last `turn.failed` event
(`--json`: one JSON event a line on stdout, where the policy's text and its commands' output sit
inside JSON strings, so no line of theirs can pass for an event; the human-readable stream on stderr,
where they print lines of their own, decides nothing). A conversation the policy grew past the context is the
policy's failure; any other error, or no last message, is a harness failure.
"""

from __future__ import annotations

import json
from pathlib import Path

from openforge.rollouts.harnesses.base import HarnessOutcome, last_line, read_text
from openforge.rollouts.harnesses.npm import find_package_bin
from openforge.rollouts.harnesses.spec_harness import SpecHarness
from openforge.sandbox.base import ExecResult, Sandbox

LAST_MESSAGE = ".forge/codex-last-message.txt"  # the spec's answer.path, relative to the working directory
# Codex's own words for the proxy's `context_length_exceeded`, in its `turn.failed` event (codex 0.171).
CONTEXT_FULL = "ran out of room in the model's context window"


def turn_error(stdout: str) -> str | None:
    """The error message of the last `turn.failed` (else `error`) event of `codex exec --json`."""
    failed = error = None
    for line in stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        if event.get("type") == "turn.failed" and isinstance(event.get("error"), dict):
            failed = event["error"].get("message")
        elif event.get("type") == "error":
            error = event.get("message")
    message = failed if isinstance(failed, str) else error
    return message.strip() if isinstance(message, str) else None


def codex_outcome(result: ExecResult, last_message: str | None) -> HarnessOutcome:
    """How Codex ended, from its exit code, its JSON events and the last-message file it wrote."""
    if result.exit_code != 0:
        error = turn_error(result.stdout)
        why = f"codex exited {result.exit_code}: {error or last_line(result.stderr) or 'no output'}"
        if error is not None and CONTEXT_FULL in error:
            return HarnessOutcome.policy_failed(why)
        return HarnessOutcome.failed(why)
    if last_message is None:
        return HarnessOutcome.failed("codex exited 0 without a last message")
    return HarnessOutcome(answer=last_message)


class CodexHarness(SpecHarness):
    """The hook specs/codex.toml names."""

    @classmethod
    def local_program(cls, cache: Path) -> str | None:
        found = find_package_bin(cache, "codex", cls.npm_harness())  # the native binary, not its Node launcher
        return str(found) if found else None

    async def outcome(self, result: ExecResult, sandbox: Sandbox) -> HarnessOutcome:
        return codex_outcome(result, await read_text(sandbox, LAST_MESSAGE) if result.exit_code == 0 else None)
