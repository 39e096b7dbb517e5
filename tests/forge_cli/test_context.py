"""forge_cli/context.py: what every command shares. Errors end as one line and an exit code (1: a ForgeError,
2: a usage error or an unexpected exception), the root's options are read wherever they stand, and
`rank_argv` writes an invocation again for torchrun's ranks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import pytest
import typer
from typer.testing import CliRunner

from openforge.errors import ConfigError
from openforge.forge_cli.context import AppState, rank_argv, state


def _app() -> typer.Typer:
    """A root like forge_cli/main.py's, with commands that fail in each way and one that echoes rank_argv."""
    from openforge.forge_cli.context import ForgeGroup

    app = typer.Typer(cls=ForgeGroup, no_args_is_help=True, add_completion=False)

    @app.callback()
    def root(ctx: typer.Context,
             home: Annotated[Optional[str], typer.Option("--home")] = None,
             set_: Annotated[Optional[list[str]], typer.Option("--set")] = None) -> None:
        ctx.obj = AppState(home_override=home, sets=list(set_ or []))

    @app.command("refused")
    def refused() -> None:
        raise ConfigError("no model is configured")

    @app.command("crash")
    def crash() -> None:
        raise RuntimeError("boom")

    @app.command("again")
    def again(ctx: typer.Context, steps: Annotated[int, typer.Option("--steps")] = 1,
              overlap: Annotated[bool, typer.Option("--overlap/--no-overlap")] = False,
              tag: Annotated[Optional[list[str]], typer.Option("--tag")] = None,
              nproc: Annotated[Optional[int], typer.Option("--nproc")] = None) -> None:
        typer.echo(json.dumps({"argv": rank_argv(ctx, nproc=None), "sets": state(ctx).sets}))

    return app


def test_a_forge_error_is_one_line_and_exit_1_and_a_crash_names_where(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FORGE_DEBUG", raising=False)
    done = CliRunner().invoke(_app(), ["refused"])
    assert (done.exit_code, done.output) == (1, "forge: error: no model is configured\n")
    done = CliRunner().invoke(_app(), ["crash"])
    assert done.exit_code == 2 and done.output.startswith("forge: internal error: RuntimeError: boom (at ")
    assert "Traceback" not in done.output and "FORGE_DEBUG=1" in done.output


def test_a_bad_option_prints_the_usage_and_exits_2() -> None:
    done = CliRunner().invoke(_app(), ["again", "--steps", "many"])
    assert done.exit_code == 2
    lines = done.output.splitlines()
    assert lines[0].startswith("Usage: ") and lines[1].endswith("again --help' for help.")
    assert lines[2].startswith("forge: error: Invalid value for '--steps'") and len(lines) == 3


def test_root_options_after_the_command_are_the_roots_and_rank_argv_writes_the_invocation_again(
        tmp_path: Path) -> None:
    done = CliRunner().invoke(_app(), ["again", "--steps", "3", "--set", "trainer.lr=0.1", "--no-overlap",
                                       "--tag", "a", "--tag", "b", "--nproc", "2", "--home", str(tmp_path / "h")])
    assert done.exit_code == 0, done.output
    got = json.loads(done.output)
    assert got["sets"] == ["trainer.lr=0.1"]  # --set after the command was still the root's
    assert got["argv"] == ["--home", str(tmp_path / "h"), "--set", "trainer.lr=0.1", "again", "--steps", "3",
                           "--no-overlap", "--tag", "a", "--tag", "b"]  # nproc replaced by None: left out
