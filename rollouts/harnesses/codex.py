"""Codex CLI (`@openai/codex`) as a harness: `codex exec` with a provider entry on the proxy's
Responses API, given as `-c` overrides so no config file is needed. Wire protocol: docs/harnesses.md.

Its final message is written by Codex itself to LAST_MESSAGE (`--output-last-message`); `outcome`
reads that file. A run that exits non-zero (Codex gave up on the API: its `ERROR:` line is the
reason) or leaves no last message is a failure, whatever it printed.
"""

from __future__ import annotations

import json

from openforge.config import HarnessConfig
from openforge.rollouts.harnesses.base import HarnessContext, HarnessOutcome, last_line, read_text
from openforge.rollouts.harnesses.npm import NpmPackageHarness, check_in_sandbox, npm_cache_dir, sandbox_executable
from openforge.sandbox.base import ExecResult, Sandbox

KEY_ENV = "FORGE_API_KEY"  # the provider's env_key: Codex sends it as `Authorization: Bearer ...`
PROVIDER = "forge"
LAST_MESSAGE = ".forge/codex-last-message.txt"  # relative to the sandbox's working directory


def provider_overrides(base_url: str) -> list[str]:
    """`-c` overrides that define the proxy as Codex's model provider and turn off its other traffic."""
    settings = [
        f"model_provider={PROVIDER}",
        f"model_providers.{PROVIDER}.name={PROVIDER}",
        f"model_providers.{PROVIDER}.base_url={base_url}",
        f"model_providers.{PROVIDER}.wire_api=responses",
        f"model_providers.{PROVIDER}.env_key={KEY_ENV}",
        # Without these Codex resolves ab.chatgpt.com (analytics) and checks for updates.
        "check_for_update_on_startup=false",
        "analytics.enabled=false",
        "feedback.enabled=false",
    ]
    return [arg for item in settings for arg in ("-c", item)]


def _error_message(line: str) -> str:
    """Codex's `ERROR: {"error": {"message": ...}}` line as `API error: <message>`; other lines as they are."""
    body = line.removeprefix("ERROR:").strip()
    try:
        error = json.loads(body).get("error")
    except (json.JSONDecodeError, AttributeError):
        return line
    message = error.get("message") if isinstance(error, dict) else None
    return f"API error: {message}" if isinstance(message, str) else line


class CodexHarness(NpmPackageHarness):
    name = "codex"

    def __init__(self, config: HarnessConfig) -> None:
        self.config = config
        self.cache = npm_cache_dir(config)

    async def prepare(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
        # CODEX_HOME defaults to ~/.codex and HOME is the sandbox's own: state stays per rollout.
        await check_in_sandbox(sandbox, ctx, self.name, self.cache)
        await sandbox.write_file(".forge/.codex", b"")  # the folder Codex writes its last message into

    def command(self, ctx: HarnessContext) -> list[str]:
        return [*sandbox_executable(ctx, self.name, self.cache), "exec",
                "--skip-git-repo-check",  # task folders are not git repositories
                # Our sandbox is the isolation; Codex's own bwrap wrapper fails inside it
                # ("execvp codex-linux-sandbox: No such file"), and approvals would wait forever.
                "--dangerously-bypass-approvals-and-sandbox",
                "--ephemeral", "--color", "never",
                "--disable", "plugins",  # the curated-plugin sync reaches github.com
                "--output-last-message", f"{ctx.workdir.rstrip('/')}/{LAST_MESSAGE}",
                "-m", ctx.model, *provider_overrides(ctx.proxy_url.rstrip("/") + "/v1"),
                *self.config.extra_args, "--", ctx.instruction]

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {KEY_ENV: ctx.api_key, "NO_COLOR": "1"}

    async def outcome(self, result: ExecResult, sandbox: Sandbox) -> HarnessOutcome:
        if result.exit_code != 0:
            errors = [ln.strip() for ln in result.stderr.splitlines() if ln.strip().startswith("ERROR")]
            why = (_error_message(errors[-1]) if errors else last_line(result.stderr)) or "no output"
            return HarnessOutcome.failed(f"codex exited {result.exit_code}: {why}")
        message = await read_text(sandbox, LAST_MESSAGE)
        if message is None:
            return HarnessOutcome.failed("codex exited 0 without a last message")
        return HarnessOutcome(answer=message)
