"""The recipes in examples/ stay valid configs (`forge config validate`, as CI runs it), the cost each
states per step is its config's, and the laptop recipe is the demo `forge up --demo` runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers.paths import REPO
from openforge.config import load_config
from openforge.forge_cli.main import app

EXAMPLES = sorted((REPO / "examples").glob("*.toml"))
COST = re.compile(r"^# Per step: (\d+) rollouts, at most (\d+) sampled tokens$", re.M)


def test_every_example_validates() -> None:
    assert {p.name for p in EXAMPLES} >= {"claw-qwen3-moe.toml", "gui-qwen-vl.toml", "single-gpu-lora.toml",
                                          "laptop-demo.toml"}
    res = CliRunner().invoke(app, ["config", "validate", *map(str, EXAMPLES)])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == [f"{p}: ok" for p in EXAMPLES]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_each_recipe_states_its_hardware_and_its_cost_per_step(path: Path) -> None:
    text = path.read_text()
    assert "Hardware it assumes:" in text
    found = COST.findall(text)
    assert len(found) == 1, f"{path.name} states no '# Per step: N rollouts, at most T sampled tokens' line"
    rollouts, tokens = map(int, found[0])
    c = load_config(path)
    assert c.proxy.max_tokens_cap is not None, "the token bound needs proxy.max_tokens_cap"
    assert rollouts == c.trainer.tasks_per_step * c.runner.samples_per_task
    assert tokens == rollouts * c.harness.max_turns * c.proxy.max_tokens_cap


def test_the_claw_and_gui_recipes_have_the_issues_numbers() -> None:
    claw = load_config(REPO / "examples" / "claw-qwen3-moe.toml")
    assert (claw.runner.samples_per_task, claw.trainer.lr, claw.trainer.kl_coef, claw.trainer.steps) == \
        (8, 1e-6, 0.001, 100)
    assert claw.engine.kind == "router" and claw.sandbox.type == "kubernetes" and claw.harness.name == "openclaw"
    gui = load_config(REPO / "examples" / "gui-qwen-vl.toml")
    assert (gui.runner.samples_per_task, gui.trainer.kl_coef) == (5, 0.0) and gui.harness.name == "browser-use"
    assert gui.trainer.entropy_coef > 0  # the recipe's entropy bonus


def test_the_laptop_recipe_is_the_demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no ./forge.toml under the preset
    demo = load_config(preset="demo")
    laptop = load_config(REPO / "examples" / "laptop-demo.toml")
    for section in ("engine", "sandbox", "harness", "tasks", "runner", "trainer"):
        assert getattr(laptop, section) == getattr(demo, section), section
    assert laptop.proxy.model_copy(update={"max_tokens_cap": None}) == demo.proxy


def test_validate_reports_each_bad_file_on_one_line_and_exits_1(tmp_path: Path) -> None:
    typo = tmp_path / "typo.toml"
    typo.write_text("[trainer]\nlearning_rate = 1e-6\n")
    broken = tmp_path / "broken.toml"
    broken.write_text("[trainer\n")
    good = tmp_path / "good.toml"
    good.write_text("[trainer]\nsteps = 3\n")
    files = [str(typo), str(broken), str(good), str(tmp_path / "none.toml")]
    res = CliRunner().invoke(app, ["config", "validate", *files])
    assert res.exit_code == 1
    lines = res.output.splitlines()
    assert len(lines) == 4, res.output
    assert str(typo) in lines[0] and "learning_rate" in lines[0]
    assert str(broken) in lines[1] and "not valid TOML" in lines[1]
    assert lines[2] == f"{good}: ok"
    assert "not found" in lines[3]
