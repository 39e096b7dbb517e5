"""forge_cli/plan_view.py: `--dry-run` prints runs/plan.py's plan and every check, and exits 1 when one would
stop the run, starting nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from rich.console import Console

from openforge.config import ForgeConfig
from openforge.errors import ConfigError
from openforge.forge_cli.plan_view import dry_run


def test_a_failing_check_is_printed_and_exits_1(forge_home: Path, tmp_path: Path) -> None:
    config = ForgeConfig()
    config.engine.model = str(tmp_path / "no-such-model")
    console = Console(record=True, width=200)
    with pytest.raises(typer.Exit) as ended:
        dry_run(config, home=forge_home, resume=None, console=console)
    assert ended.value.exit_code == 1
    out = console.export_text()
    assert "checks" in out and "FAIL" in out and "no-such-model" in out
    assert "harness run: not run (a check above failed)" in out and "nothing was started" in out
    assert not list((forge_home / "runs").glob("run-*")) if (forge_home / "runs").exists() else True


def test_dry_run_plans_new_runs_only(forge_home: Path) -> None:
    with pytest.raises(ConfigError, match="--resume continues one with its stored config"):
        dry_run(ForgeConfig(), home=forge_home, resume="latest", console=Console())
