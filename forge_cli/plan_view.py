"""`forge up --dry-run` / `forge train --dry-run`: the plan of runs/plan.py printed, and its exit code."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from openforge.config import ForgeConfig
from openforge.errors import ConfigError

_MARK = {"ok": "[green]ok  [/]", "warn": "[yellow]warn[/]", "missing": "[red]FAIL[/]"}


def dry_run(config: ForgeConfig, *, home: Path, resume: str | None, console: Console, harness_check: bool = True) -> None:
    """Print what `config` would run and every check; exit 1 when a check would stop the run. With
    `harness_check`, once the plan's checks pass, each harness of the run runs one tiny rollout under the
    run's settings (runs/harness_check.py) in a scratch store: a prompt the harness fills past the context
    fails here instead of as a run of configuration failures."""
    from openforge.runs.plan import plan_run

    if resume is not None:
        raise ConfigError("--dry-run plans a new run from the config; --resume continues one with its stored config")
    plan = plan_run(config, home)
    for title, lines in plan.sections.items():
        console.print(f"[bold]{title}[/]")
        for key, value in lines:
            console.print(f"  {key:<13} {escape(value)}", soft_wrap=True)
    for doc in plan.manifests:
        console.print(f"[bold]{doc['kind']} manifest[/] (one per rollout)" if doc["kind"] == "Pod"
                      else f"[bold]{doc['kind']} manifest[/]")
        console.print(escape(json.dumps(doc, indent=2)), soft_wrap=True, highlight=False)
    console.print("[bold]checks[/]")
    for check in plan.checks:
        detail = check.detail if check.detail.startswith(check.name) else f"{check.name}: {check.detail}".rstrip(": ")
        console.print(f"  {_MARK[check.verdict]}  {escape(detail)}", soft_wrap=True)
    if plan.failed:
        if harness_check:
            console.print(f"  {_MARK['warn']}  harness run: not run (a check above failed); it runs once they pass")
        console.print(f"[red]{len(plan.failed)} check(s) would stop this run[/]; nothing was started")
        raise typer.Exit(1)
    if not harness_check:
        console.print("nothing was started; every check passed")
        return
    from openforge.runs.harness_check import harness_run_checks

    with console.status("checking the harness") as status:
        runs = harness_run_checks(config, home=home, on_harness=lambda name: status.update(
            f"checking {name}: one tiny rollout through the proxy under this run's settings "
            "(--no-harness-check skips it)"))
    for check in runs:
        console.print(f"  {_MARK[check.verdict]}  {escape(check.detail)}", soft_wrap=True)
    failed = [c for c in runs if c.verdict == "missing"]
    if failed:
        console.print(f"[red]{len(failed)} harness check(s) would stop this run[/]; no run was started (each "
                      "harness ran once, in a scratch store)", soft_wrap=True)
        raise typer.Exit(1)
    console.print("no run was started (each harness ran once, in a scratch store); every check passed", soft_wrap=True)
