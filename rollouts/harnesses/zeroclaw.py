"""ZeroClaw (zeroclaw-labs/zeroclaw) as a harness — usable only where a `zeroclaw` binary exists.

ZeroClaw is a single Rust binary, not an npm package (`npm view zeroclaw` is a 404; PyPI's
`zeroclaw` is an unrelated installer). It installs with `cargo install zeroclaw` (crates.io), from its
GitHub release binaries, or Homebrew — none of which this project's machines can reach, so this
adapter is written from ZeroClaw's documentation and has not run here (docs/harnesses.md says so).

What it does where the binary is on the sandbox's PATH: write `$ZEROCLAW_WORKSPACE/config.toml`
with the proxy as a `custom:` OpenAI-compatible provider, full autonomy (no approval prompts; the
sandbox is the isolation) and the tool-iteration cap, then run `zeroclaw agent -m <instruction>`. Its reply is what it prints to stdout (documented; not
seen here), so `outcome` takes stdout as the answer only on exit 0 with something printed.
"""

from __future__ import annotations

import json
import shutil

from openforge.config import ForgeConfig, HarnessConfig
from openforge.errors import HarnessError
from openforge.rollouts.harnesses.base import HarnessBase, HarnessContext, HarnessOutcome, last_line
from openforge.sandbox.base import ExecResult, Sandbox

WORKSPACE = ".forge/zeroclaw"  # ZeroClaw's config/state folder, relative to the sandbox's workdir


def zeroclaw_config(ctx: HarnessContext, max_tool_iterations: int) -> str:
    """config.toml (values written as JSON strings, which TOML accepts for basic strings)."""
    provider = "custom:" + ctx.proxy_url.rstrip("/") + "/v1"
    return "\n".join([
        f"default_provider = {json.dumps(provider)}",
        f"default_model = {json.dumps(ctx.model)}",
        f"api_key = {json.dumps(ctx.api_key)}",
        "",
        "[autonomy]",
        'level = "full"',
        "",
        "[agent]",
        f"max_tool_iterations = {max_tool_iterations}",
        "",
    ])


class ZeroClawHarness(HarnessBase):
    name = "zeroclaw"

    @classmethod
    def available(cls, config: ForgeConfig) -> str | None:
        return None if shutil.which("zeroclaw") else (
            "zeroclaw is not on the PATH: it is a Rust binary, not on npm (`cargo install zeroclaw`); see docs/harnesses.md")

    def __init__(self, config: HarnessConfig) -> None:
        self.config = config

    async def prepare(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
        found = await sandbox.exec(["/bin/sh", "-c", "command -v zeroclaw"], timeout=30)
        if found.exit_code != 0:
            raise HarnessError("zeroclaw is not installed in the sandbox: it is a Rust binary, not on npm; "
                               "install it with `cargo install zeroclaw` (or a release binary) on the PATH "
                               "of the sandbox (image); see docs/harnesses.md")
        await sandbox.write_file(f"{WORKSPACE}/config.toml",
                                 zeroclaw_config(ctx, self.config.max_turns).encode(), mode=0o600)

    def command(self, ctx: HarnessContext) -> list[str]:
        return ["zeroclaw", "agent", *self.config.extra_args, "-m", ctx.instruction]

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {"ZEROCLAW_WORKSPACE": f"{ctx.workdir.rstrip('/')}/{WORKSPACE}", "NO_COLOR": "1"}

    async def outcome(self, result: ExecResult, sandbox: Sandbox) -> HarnessOutcome:
        if result.exit_code != 0:
            why = last_line(result.stderr) or last_line(result.stdout) or "no output"
            return HarnessOutcome.failed(f"zeroclaw exited {result.exit_code}: {why}")
        if not result.stdout.strip():
            return HarnessOutcome.failed("zeroclaw exited 0 without a reply")
        return HarnessOutcome(answer=result.stdout.strip())
