"""openforge/presets/: the presets shipped as TOML files, read by name; a harness's own preset laid over the
general one where it exists."""

from __future__ import annotations

import pytest

from openforge.config import ForgeConfig
from openforge.errors import ConfigError
from openforge.presets import preset_layers, preset_names, read_preset


def test_the_shipped_presets_are_listed_and_each_holds_only_config_sections() -> None:
    names = preset_names()
    assert "demo" in names and "demo-codex" in names and names == sorted(names)
    sections = set(ForgeConfig.model_fields)
    for name in names:
        assert set(read_preset(name)) <= sections, name


def test_a_harness_preset_is_laid_over_the_general_one_only_where_it_exists() -> None:
    assert preset_layers("demo", "codex") == [read_preset("demo"), read_preset("demo-codex")]
    assert preset_layers("demo", "mini") == [read_preset("demo")]  # no demo-mini.toml
    assert preset_layers("demo", None) == [read_preset("demo")]


def test_an_unknown_preset_names_the_ones_there_are() -> None:
    with pytest.raises(ConfigError, match="no preset 'dmeo'; the presets are demo, "):
        read_preset("dmeo")
