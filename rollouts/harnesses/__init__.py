"""Harness adapters by name. Each lives in its own module, imported only when asked for, so `forge`
starts fast and an adapter's missing dependency only matters to whoever uses it.

`HARNESSES` is the one place that lists harness names: anything else asks the adapter class what it
needs (`available`, `gui`, `own_browser`, `calls_model`: rollouts/harnesses/base.py).
"""

from __future__ import annotations

import importlib

from openforge.config import ForgeConfig, HarnessConfig
from openforge.errors import HarnessError
from openforge.rollouts.harnesses.base import Harness, HarnessBase

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


def harness_class(name: str) -> type[HarnessBase]:
    """The adapter class registered as `name`. HarnessError if unknown or its module cannot load."""
    entry = HARNESSES.get(name)
    if entry is None:
        raise HarnessError(f"unknown harness {name!r}; known: {', '.join(HARNESSES)}")
    module_name, class_name = entry
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise HarnessError(f"harness {name!r} is not available here: {exc}") from None
    cls = vars(module).get(class_name)
    if cls is None:
        raise HarnessError(f"harness {name!r}: {module_name} defines no {class_name}")
    return cls


def get_harness(config: HarnessConfig) -> Harness:
    """The adapter named by `config.name`, built with its config. HarnessError if unknown or unavailable."""
    return harness_class(config.name)(config)  # type: ignore[call-arg]


def harness_available(config: ForgeConfig) -> str | None:
    """None when `config.harness` can run with `config.sandbox`, else the fix to print (for preflight).

    A sandbox that runs host programs (local) runs what this machine has: the adapter's `available`
    checks it (the npm cache's executables, this venv's `openai` for `mini`, a `zeroclaw` on the PATH).
    Container sandboxes run their image's install, which only a started container can show: the
    adapter's `prepare` checks it (a harness failure names the fix)."""
    from openforge.sandbox.factory import sandbox_class

    name = config.harness.name
    if name not in HARNESSES:
        return f"unknown harness {name!r}; known: {', '.join(HARNESSES)}"
    if not sandbox_class(config.sandbox.type).runs_host_programs:
        return None
    return harness_class(name).available(config)
