"""Presets: named config values kept as TOML files in this folder, which `load_config` lays between
the config file and the `--set` items (openforge/config.py).

    demo.toml               `forge up --demo`: the tiny model, the mini harness, the built-in tasks
    demo-<harness>.toml     laid over demo.toml when the run's harness is <harness> (claude-code, codex,
                            mini-gui, browser-use): the same demo sized for that harness

A preset file holds the keys of `forge.toml` (openforge/config.py's sections), nothing else.
"""

from __future__ import annotations

import tomllib
from importlib.resources import files
from typing import Any

from openforge.errors import ConfigError


def preset_names() -> list[str]:
    """The presets this install ships, by name (the file name without .toml)."""
    return sorted(p.name.removesuffix(".toml") for p in files(__package__).iterdir() if p.name.endswith(".toml"))


def read_preset(name: str) -> dict[str, Any]:
    """The values of preset `name` (ConfigError if there is no such preset)."""
    path = files(__package__) / f"{name}.toml"
    if not path.is_file():
        raise ConfigError(f"no preset {name!r}; the presets are {', '.join(preset_names())}")
    return tomllib.loads(path.read_text(encoding="utf-8"))


def preset_layers(name: str, harness: str | None) -> list[dict[str, Any]]:
    """Preset `name`, then `name-<harness>` where that file exists: the layers to merge, lowest first."""
    layers = [read_preset(name)]
    if harness and f"{name}-{harness}" in preset_names():
        layers.append(read_preset(f"{name}-{harness}"))
    return layers
