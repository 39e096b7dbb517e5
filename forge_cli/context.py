"""What every command shares: the data dir, the effective config, the store, error reporting."""

from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import typer
from typer.core import TyperGroup

from openforge.config import ForgeConfig, load_config
from openforge.errors import ForgeError
from openforge.paths import forge_home
from openforge.store import Store, open_store


class ForgeGroup(TyperGroup):
    """Turns a `ForgeError` anywhere below into one line on stderr and exit code 1.

    An unexpected exception also becomes one line (FORGE_DEBUG=1 shows the traceback)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ForgeError as exc:
            typer.echo(f"forge: error: {exc}", err=True)
            raise typer.Exit(1) from None
        except (typer.Exit, click.exceptions.Exit, click.ClickException, click.exceptions.Abort, KeyboardInterrupt):
            raise
        except OSError as exc:
            if os.environ.get("FORGE_DEBUG"):
                raise
            typer.echo(f"forge: error: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""),
                       err=True)
            raise typer.Exit(1) from None
        except Exception as exc:  # noqa: BLE001 - the last line of defence against tracebacks
            if os.environ.get("FORGE_DEBUG"):
                raise
            where = traceback.extract_tb(exc.__traceback__)[-1]
            typer.echo(
                f"forge: internal error: {type(exc).__name__}: {exc} "
                f"(at {Path(where.filename).name}:{where.lineno}; FORGE_DEBUG=1 shows the traceback)",
                err=True,
            )
            raise typer.Exit(2) from None


@dataclass
class AppState:
    home_override: str | None = None
    config_path: str | None = None
    sets: list[str] = field(default_factory=list)
    _store: Store | None = None

    @property
    def home(self) -> Path:
        try:
            return forge_home(self.home_override)
        except OSError as exc:
            raise ForgeError(f"cannot create the data dir: {exc}") from None

    def config(self, overrides: dict[str, Any] | None = None) -> ForgeConfig:
        return load_config(self.config_path, overrides=overrides, sets=self.sets)

    def store(self) -> Store:
        if self._store is None:
            self._store = open_store(self.home)
        return self._store


def state(ctx: typer.Context) -> AppState:
    obj = ctx.find_root().obj
    if not isinstance(obj, AppState):  # a command module invoked without the root callback
        obj = ctx.find_root().obj = AppState()
    return obj


def new_typer(**kwargs: Any) -> typer.Typer:
    """A sub-app with the same error handling as the root."""
    return typer.Typer(cls=ForgeGroup, no_args_is_help=True, add_completion=False, **kwargs)


def is_tty() -> bool:
    return sys.stdout.isatty()
