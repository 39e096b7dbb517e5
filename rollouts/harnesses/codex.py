"""Codex CLI (`@openai/codex`) as a harness: `codex exec` with a provider entry on the proxy's
Responses API, given as `-c` overrides so no config file is needed. Wire protocol: docs/harnesses.md.
"""

from __future__ import annotations

from openforge.config import HarnessConfig
from rollouts.harness import HarnessContext
from rollouts.npm import check_in_sandbox, npm_cache_dir, sandbox_executable
from sandbox.base import Sandbox

KEY_ENV = "FORGE_API_KEY"  # the provider's env_key: Codex sends it as `Authorization: Bearer ...`
PROVIDER = "forge"


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


class CodexHarness:
    name = "codex"

    def __init__(self, config: HarnessConfig) -> None:
        self.config = config
        self.cache = npm_cache_dir(config)

    async def prepare(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
        # CODEX_HOME defaults to ~/.codex and HOME is the sandbox's own: state stays per rollout.
        await check_in_sandbox(sandbox, ctx, self.name, self.cache)

    def command(self, ctx: HarnessContext) -> list[str]:
        return [*sandbox_executable(ctx, self.name, self.cache), "exec",
                "--skip-git-repo-check",  # task folders are not git repositories
                # Our sandbox is the isolation; Codex's own bwrap wrapper fails inside it
                # ("execvp codex-linux-sandbox: No such file"), and approvals would wait forever.
                "--dangerously-bypass-approvals-and-sandbox",
                "--ephemeral", "--color", "never",
                "--disable", "plugins",  # the curated-plugin sync reaches github.com
                "-m", ctx.model, *provider_overrides(ctx.proxy_url.rstrip("/") + "/v1"),
                *self.config.extra_args, "--", ctx.instruction]

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {KEY_ENV: ctx.api_key, "NO_COLOR": "1"}
