"""`forge harness install NAME`: put an npm harness into the npm cache, with npm's progress shown."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from forge_cli.context import new_typer, state

harness_app = new_typer(help="Agent harnesses: install the npm ones (claude-code, codex, openclaw).")


@harness_app.command("install")
def install(ctx: typer.Context,
            name: Annotated[str, typer.Argument(help="claude-code, codex or openclaw")],
            cache: Annotated[Optional[Path], typer.Option("--cache", help="the npm cache folder (default: "
                             "harness.npm_cache, else $FORGE_NPM_CACHE, else $FORGE_HOME/npm)")] = None,
            ) -> None:
    """Install an npm harness into the cache the local sandbox runs it from (a no-op if it is there)."""
    from rollouts.npm import install_harness, npm_cache_dir

    harness = state(ctx).config().harness
    folder = cache.expanduser().resolve() if cache else npm_cache_dir(harness)
    console = Console(stderr=True)
    fetched = 0
    with console.status(f"npm install {name} into {folder}") as status:
        def progress(line: str) -> None:
            nonlocal fetched
            fetched += "http fetch" in line
            status.update(f"npm install {name} into {folder}: {fetched} package(s) fetched  {line[-60:]}")

        exe = install_harness(name, folder, on_line=progress)
    typer.echo(f"{name} ready: {exe}")
    if cache and not harness.npm_cache:
        typer.echo(f"use it with: --set harness.npm_cache={folder}  (or export FORGE_NPM_CACHE={folder})")


def register(app: typer.Typer) -> None:
    """Add this part's commands to the root app."""
    app.add_typer(harness_app, name="harness")
