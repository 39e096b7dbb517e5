"""What every command shares: the data dir, the effective config, the store, error reporting."""

from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import typer
from typer.core import TyperGroup, TyperOption

from openforge.config import ForgeConfig, load_config
from openforge.errors import ForgeError
from openforge.paths import forge_home
from openforge.store import Store, open_store


def _usage_error(exc: typer.TyperException, ctx: Any = None) -> NoReturn:
    """A bad option or value: the command's usage line, the hint, one error line; exit 2 (Click's code).
    `ctx`: the command's context when the parser raised without one (an option missing its value)."""
    ctx = getattr(exc, "ctx", None) or ctx
    if ctx is not None:
        typer.echo(ctx.get_usage(), err=True)
        typer.echo(f"Try '{ctx.command_path} --help' for help.", err=True)
    typer.echo(f"forge: error: {exc.format_message()}", err=True)
    raise typer.Exit(getattr(exc, "exit_code", 2))


class ForgeGroup(TyperGroup):
    """Turns a `ForgeError` anywhere below into one line on stderr and exit code 1, and a usage error
    (an unknown option, a bad value, a missing argument) into the usage line and exit code 2.

    An unexpected exception also becomes one line (FORGE_DEBUG=1 shows the traceback). Typer 0.29
    vendors Click: its parser errors are `typer.TyperException`s, not `click.ClickException`s."""

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        if parent is None:
            args = self._root_options_first(list(args))
        try:  # the group's own options (`forge --set` without a value) are parsed here
            return super().make_context(info_name, args, parent=parent, **extra)
        except typer.TyperException as exc:
            _usage_error(exc, self.context_class(self, info_name=info_name, parent=parent))

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except ForgeError as exc:
            typer.echo(f"forge: error: {exc}", err=True)
            raise typer.Exit(1) from None
        except typer.TyperException as exc:  # a subcommand's options, an unknown command
            _usage_error(exc, self._subcommand_context(ctx))
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
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

    def _root_options_first(self, args: list[str]) -> list[str]:
        """`forge up --config F --set K=V` as `forge --config F --set K=V up`: the root's options (each takes
        a value) are read wherever they stand, as the recipes' headers and most CLIs write them, unless the
        command itself has an option of that name. Nothing after `--` is touched."""
        takes_value = {opt for p in self.params for opt in p.opts}  # --home, --config/-c, --set
        i = 0
        while i < len(args) and args[i].startswith("-") and args[i] != "--":  # the root's own, before the command
            i += 1 if "=" in args[i] or args[i] not in takes_value else 2
        if i >= len(args) or (command := self.commands.get(args[i])) is None:
            return args
        own = _option_names(command)
        head, tail, moved = args[:i + 1], args[i + 1:], []
        kept: list[str] = []
        j = 0
        while j < len(tail):
            token = tail[j]
            if token == "--":
                kept += tail[j:]
                break
            name = token.partition("=")[0] if token.startswith("--") else token
            if name in takes_value and name not in own:
                width = 1 if "=" in token or j + 1 == len(tail) else 2
                moved += tail[j:j + width]
                j += width
            else:
                kept.append(token)
                j += 1
        return [*head[:i], *moved, *head[i:], *kept]

    def _subcommand_context(self, ctx: Any) -> Any:
        """A context of the subcommand being parsed (Click names it before parsing its arguments)."""
        name = ctx.invoked_subcommand
        cmd = self.get_command(ctx, name) if name else None
        return cmd.context_class(cmd, info_name=name, parent=ctx) if cmd is not None else ctx


def _option_names(command: Any) -> set[str]:
    """Every option spelling of `command` and of the commands under it."""
    names = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    for sub in (command.commands.values() if isinstance(command, TyperGroup) else ()):
        names |= _option_names(sub)
    return names


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

    def config(self, overrides: dict[str, Any] | None = None, *, preset: str | None = None) -> ForgeConfig:
        """The effective config: defaults < forge.toml < `preset` < --set items < `overrides` (the flags)."""
        return load_config(self.config_path, overrides=overrides, sets=self.sets, preset=preset)

    def store(self) -> Store:
        if self._store is None:
            self._store = open_store(self.home, url=self.config().store.url)
        return self._store


def state(ctx: typer.Context) -> AppState:
    obj = ctx.find_root().obj
    if not isinstance(obj, AppState):  # a command module invoked without the root callback
        obj = ctx.find_root().obj = AppState()
    return obj


def rank_argv(ctx: typer.Context, **replace: Any) -> list[str]:
    """This invocation again, for each torchrun rank: the root options (the data dir resolved), the
    command, and every option it was given (`replace` sets some, e.g. nproc), as the user would write them."""
    st = state(ctx)
    out = ["--home", str(st.home), *(["--config", st.config_path] if st.config_path else [])]
    for item in st.sets:
        out += ["--set", item]
    out.append(ctx.command.name or ctx.info_name or "")
    values = {**ctx.params, **replace}
    for param in ctx.command.params:
        value = values.get(param.name or "")
        if not isinstance(param, TyperOption) or value is None:
            continue
        if param.is_flag and param.secondary_opts:  # --overlap/--no-overlap: either one is a choice
            out.append(param.opts[0] if value else param.secondary_opts[0])
        elif param.is_flag:
            out += [param.opts[0]] if value else []
        else:
            for one in value if param.multiple else [value]:
                out += [param.opts[0], str(one)]
    return out


def new_typer(**kwargs: Any) -> typer.Typer:
    """A sub-app with the same error handling as the root."""
    return typer.Typer(cls=ForgeGroup, no_args_is_help=True, add_completion=False, **kwargs)


def is_tty() -> bool:
    return sys.stdout.isatty()
