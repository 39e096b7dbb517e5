"""`forge analyze RUN [RUN ...] [--by harness|step|task] [--json] [--html OUT]`: what the agent does, not only
its score."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from openforge.forge_cli.context import state
from openforge.errors import ConfigError
from openforge.rollouts.analysis.analyze import METRICS, Estimate, GroupBy, Report, analyze

console = Console()

# Rates are shown as percentages; counts as plain numbers.
_RATES = {"tool_coverage", "self_verified", "error_recovery", "plan_completion", "gave_up"}


def _cell(metric: str, est: Estimate, *, signed: bool = False) -> str:
    if est.mean is None:
        return "-"
    scale, unit = (100.0, "%") if metric in _RATES else (1.0, "")
    sign = "+" if signed else ""
    mean = f"{est.mean * scale:{sign}.1f}{unit}"
    if est.lo is None or est.hi is None or est.n < 2:
        return mean
    return f"{mean} [{est.lo * scale:.1f}, {est.hi * scale:.1f}]"


def report_table(report: Report) -> Table:
    table = Table(title=f"behaviour of {', '.join(report.runs)} by {report.by}  (mean [95% bootstrap CI])")
    table.add_column("metric")
    for g in report.groups:
        table.add_column(f"{g.key}\n(n={g.n_rollouts})", justify="right")
    for c in report.changes:
        table.add_column(f"change\n{c.other} - {c.base}", justify="right")
    for k in (report.groups[0].pass_at if report.groups else {}):
        table.add_row(f"pass@{k}", *[_pct(g.pass_at[k]) for g in report.groups], *["" for _ in report.changes])
        table.add_row(f"pass^{k}", *[_pct(g.pass_hat[k]) for g in report.groups], *["" for _ in report.changes])
    for m in METRICS:
        table.add_row(m, *[_cell(m, g.metrics[m]) for g in report.groups],
                      *[_cell(m, c.metrics[m], signed=True) for c in report.changes])
    return table


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def analyze_cmd(
    ctx: typer.Context,
    runs: Annotated[list[str], typer.Argument(help="run ids (unique prefixes, or 'latest')")],
    by: Annotated[str, typer.Option("--by", help="group rollouts by harness, step (first vs last) or task")] = "step",
    first: Annotated[int, typer.Option("--first", help="--by step: how many first steps form the 'before' group")] = 1,
    last: Annotated[int, typer.Option("--last", help="--by step: how many last steps form the 'after' group")] = 1,
    k: Annotated[Optional[list[int]], typer.Option("-k", help="k of pass@k and pass^k (repeatable)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON (with every rollout's row)")] = False,
    html_out: Annotated[Optional[Path], typer.Option("--html", help="also write the table and per-step curves to "
                                                      "this HTML file (static, no script)")] = None,
) -> None:
    """Behaviour metrics per rollout (turns, tool coverage, self-verification, error recovery, ...),
    compared across harnesses or between the first and last steps of training. See docs/analyze.md."""
    store = state(ctx).store()
    run_ids = [store.get_run(r).id for r in runs]
    by_: GroupBy = by  # type: ignore[assignment] - analyze() validates it
    report = analyze(store, run_ids, by=by_, k_values=k or [1, 3], first_steps=first, last_steps=last)
    if html_out is not None:
        from openforge.rollouts.analysis.html import report_html, step_curves

        try:
            html_out.write_text(report_html(report, step_curves(report.rollouts)))
        except OSError as exc:
            raise ConfigError(f"cannot write {html_out}: {exc.strerror or exc}") from None
        if not as_json:
            typer.echo(f"wrote {html_out}")
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=1))
        return
    if not report.rollouts:
        typer.echo("no sampled rollouts in these runs (rollouts that failed for infra or harness reasons are not samples)")
        return
    console.print(report_table(report))
    for g in report.groups:
        if g.break_reasons:
            reasons = ", ".join(f"{reason} x{n}" for reason, n in g.break_reasons.items())
            console.print(f"prefix breaks in {g.key}: {reasons}")


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze_cmd)
