"""Harness adapters by name. Each lives in its own module, imported only when asked for, so `forge`
starts fast and an adapter's missing dependency only matters to whoever uses it."""

from __future__ import annotations

import importlib

from openforge.config import HarnessConfig
from openforge.errors import HarnessError
from rollouts.harness import Harness

# name -> (module, class)
HARNESSES: dict[str, tuple[str, str]] = {
    "mini": ("rollouts.harnesses.mini", "MiniHarness"),
    "claude-code": ("rollouts.harnesses.claude_code", "ClaudeCodeHarness"),
    "codex": ("rollouts.harnesses.codex", "CodexHarness"),
    "openclaw": ("rollouts.harnesses.openclaw", "OpenClawHarness"),
    "zeroclaw": ("rollouts.harnesses.zeroclaw", "ZeroClawHarness"),
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
