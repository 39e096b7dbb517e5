"""`forge harness install NAME`: put an npm harness into the npm cache, with npm's progress shown."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from openforge.forge_cli.context import new_typer, state

harness_app = new_typer(help="Agent harnesses: install the npm ones (claude-code, codex, openclaw) and browser-use (pip).")


@harness_app.command("install")
def install(ctx: typer.Context,
            name: Annotated[str, typer.Argument(help="claude-code, codex, openclaw or browser-use")],
            cache: Annotated[Optional[Path], typer.Option("--cache", help="the npm cache folder (default: "
                             "harness.npm_cache, else $FORGE_NPM_CACHE, else $FORGE_HOME/npm)")] = None,
            ) -> None:
    """Install an npm harness into the cache the local sandbox runs it from (a no-op if it is there)."""
    from openforge.rollouts.harnesses.npm import install_harness, npm_cache_dir

    harness = state(ctx).config().harness
    folder = cache.expanduser().resolve() if cache else npm_cache_dir(harness)
    console = Console(stderr=True)
    if name == "browser-use":  # a pinned pip install into its own venv in the same folder
        from openforge.rollouts.harnesses.browseruse import BROWSER_USE_VERSION, install_browser_use
        with console.status(f"pip install browser-use=={BROWSER_USE_VERSION} into {folder}") as status:
            exe = install_browser_use(folder, on_line=lambda line: status.update(
                f"pip install browser-use=={BROWSER_USE_VERSION} into {folder}  {line[-60:]}"))
        typer.echo(f"{name} ready: {exe}")
        if cache and not harness.npm_cache:
            typer.echo(f"use it with: --set harness.npm_cache={folder}  (or export FORGE_NPM_CACHE={folder})")
        return
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
