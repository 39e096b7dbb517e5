"""Harness adapters by name. Each lives in its own module, imported only when asked for, so `forge`
starts fast and an adapter's missing dependency only matters to whoever uses it."""

from __future__ import annotations

import importlib
import importlib.util
import shutil
import sys

from openforge.config import ForgeConfig, HarnessConfig
from openforge.errors import HarnessError
from openforge.rollouts.harnesses.base import Harness

# name -> (module, class)
HARNESSES: dict[str, tuple[str, str]] = {
    "mini": ("openforge.rollouts.harnesses.mini", "MiniHarness"),
    "claude-code": ("openforge.rollouts.harnesses.claude_code", "ClaudeCodeHarness"),
    "codex": ("openforge.rollouts.harnesses.codex", "CodexHarness"),
    "openclaw": ("openforge.rollouts.harnesses.openclaw", "OpenClawHarness"),
    "zeroclaw": ("openforge.rollouts.harnesses.zeroclaw", "ZeroClawHarness"),
    "mini-gui": ("openforge.rollouts.harnesses.mini_gui", "MiniGuiHarness"),
    "browser-use": ("openforge.rollouts.harnesses.browseruse", "BrowserUseHarness"),
}


def get_harness(config: HarnessConfig) -> Harness:
    """The adapter named by `config.name`, built with its config. HarnessError if unknown or unavailable."""
    entry = HARNESSES.get(config.name)
    if entry is None:
        raise HarnessError(f"unknown harness {config.name!r}; known: {', '.join(HARNESSES)}")
    module_name, class_name = entry
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise HarnessError(f"harness {config.name!r} is not available here: {exc}") from None
    cls = getattr(module, class_name, None) or next(
        (obj for obj in vars(module).values()  # any adapter class whose `name` is the one asked for
         if isinstance(obj, type) and getattr(obj, "name", None) == config.name and hasattr(obj, "command")), None)
    if cls is None:
        raise HarnessError(f"harness {config.name!r}: {module_name} defines no {class_name}")
    return cls(config)


def harness_available(config: ForgeConfig) -> str | None:
    """None when `config.harness` can run with `config.sandbox`, else the fix to print (for preflight).

    Local sandboxes run what this machine has: the npm cache's executables, this venv's `openai` for
    `mini`, a `zeroclaw` on the PATH. Container sandboxes run their image's install, which only a
    started container can show: the adapter's `prepare` checks it (a harness failure names the fix)."""
    from openforge.rollouts.harnesses.npm import NPM_HARNESSES, find_package_bin, node_binary, npm_cache_dir

    name = config.harness.name
    if name not in HARNESSES:
        return f"unknown harness {name!r}; known: {', '.join(HARNESSES)}"
    if config.sandbox.type != "local":
        return None
    if name == "mini":
        if importlib.util.find_spec("openai") is None:
            return f"the mini harness needs the `openai` package in {sys.executable}: pip install openai"
        return None
    if name == "mini-gui":
        if importlib.util.find_spec("PIL") is None:
            return f"the mini-gui harness needs Pillow in {sys.executable}: pip install pillow"
        return None if shutil.which("xdotool") else "the mini-gui harness needs xdotool: apt-get install xdotool"
    if name == "browser-use":
        from openforge.rollouts.harnesses.browseruse import find_chromium, venv_python
        if venv_python(npm_cache_dir(config.harness)) is None:
            return f"browser-use is not installed in {npm_cache_dir(config.harness)}: run `forge harness install browser-use`"
        return None if find_chromium() else "browser-use needs a Chromium on this machine: apt-get install chromium"
    if name == "zeroclaw":
        return None if shutil.which("zeroclaw") else (
            "zeroclaw is not on the PATH: it is a Rust binary, not on npm (`cargo install zeroclaw`); see docs/harnesses.md")
    cache = npm_cache_dir(config.harness)
    default = npm_cache_dir(None) == cache
    fix = f"forge harness install {name}" + ("" if default else f" --cache {cache}")
    if find_package_bin(cache, name) is None:
        return f"harness {name!r} is not installed in {cache}: run `{fix}`"
    if NPM_HARNESSES[name].needs_node and node_binary(cache) is None:
        return f"harness {name!r} needs Node {NPM_HARNESSES[name].needs_node} in {cache}: run `{fix}`"
    return None
