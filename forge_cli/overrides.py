"""Flags as config overrides: the values a command's flags set, nested as the config's sections.

They are the top layer of `load_config` (defaults < forge.toml < preset < --set < flags); the demo's
settings are a preset (openforge/presets/demo*.toml), not flags.
"""

from __future__ import annotations

from typing import Any


def flag_overrides(values: dict[str, Any]) -> dict[str, Any]:
    """{"trainer.steps": 3, "name": None, "harness.name": "codex"} -> {"trainer": {"steps": 3},
    "harness": {"name": "codex"}}: the flags that were given (not None), nested by their dotted keys."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if value is None:
            continue
        *sections, leaf = key.split(".")
        node = out
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = value
    return out
