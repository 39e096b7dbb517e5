"""The CLI tests' runner and readers: invoke a command through Typer's CliRunner, plain text of a screen, wait
for a condition."""

from __future__ import annotations

from rich.console import Console
from typer.testing import CliRunner

from openforge.forge_cli.main import app


def plain(renderable: object, width: int = 200) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))
    console.print(renderable)
    return console.export_text()


async def wait_for(pilot, predicate, timeout: float = 5.0) -> None:
    """Let the app's timer run until `predicate()` holds (2 shared cores: no fixed sleeps)."""
    for _ in range(int(timeout / 0.05)):
        if predicate():
            return
        await pilot.pause(0.05)
    assert predicate()


runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)
