"""forge_cli/overrides.py: a command's flags as the top layer of the config, nested by their dotted keys."""

from __future__ import annotations

from openforge.config import load_config
from openforge.forge_cli.overrides import flag_overrides


def test_given_flags_nest_by_section_and_flags_left_out_set_nothing() -> None:
    got = flag_overrides({"trainer.steps": 3, "name": None, "harness.name": "codex", "trainer.lr": 0.5,
                          "sandbox.type": None})
    assert got == {"trainer": {"steps": 3, "lr": 0.5}, "harness": {"name": "codex"}}
    assert flag_overrides({"a.b": None}) == {}


def test_the_flags_win_over_set_items() -> None:
    config = load_config(None, overrides=flag_overrides({"trainer.steps": 7, "trainer.lr": None}),
                         sets=["trainer.steps=2", "trainer.lr=0.25"])
    assert (config.trainer.steps, config.trainer.lr) == (7, 0.25)
