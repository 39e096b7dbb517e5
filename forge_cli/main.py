"""`forge`: the one command. Each command parses its options, calls a library, and prints.

Commands are grouped by the part they drive; each group lives in its own `cmd_*.py` module and adds
itself with `register(app)`.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

import openforge
from openforge.forge_cli import (cmd_analyze, cmd_collect, cmd_engine, cmd_harness, cmd_proxy, cmd_rollouts,
                                 cmd_sandbox, cmd_sft, cmd_train, cmd_up)
from openforge.forge_cli.context import AppState, ForgeGroup, new_typer, state
from openforge.runs.checks import run_checks
from openforge.config import describe_toml

app = typer.Typer(
    cls=ForgeGroup,
    no_args_is_help=True,
    add_completion=False,
    help="OpenForge: train LLM agents inside the real harness they are deployed with.",
)
console = Console()


@app.callback()
def root(
    ctx: typer.Context,
    home: Annotated[Optional[str], typer.Option("--home", help="data dir (default $FORGE_HOME or ~/.forge)")] = None,
    config: Annotated[Optional[str], typer.Option("--config", "-c", help="TOML config (default ./forge.toml if present)")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="override a config value: section.key=value")] = None,
) -> None:
    ctx.obj = AppState(home_override=home, config_path=config, sets=list(set_ or []))


@app.command()
def version() -> None:
    """Print the OpenForge version and the versions of the libraries it runs on."""
    import importlib.metadata as md

    parts = [f"openforge {openforge.__version__}"]
    for dist in ("torch", "transformers", "peft", "textual"):
        try:
            parts.append(f"{dist} {md.version(dist)}")
        except md.PackageNotFoundError:
            parts.append(f"{dist} (missing)")
    typer.echo(" | ".join(parts))


@app.command()
def doctor(ctx: typer.Context) -> None:
    """Report what this machine has (torch, GPU, Docker, Kubernetes, SGLang, npm harnesses)."""
    st = state(ctx)
    checks = run_checks(st.config(), st.home)
    table = Table(title="forge doctor", show_lines=False)
    table.add_column("item")
    table.add_column("verdict")
    table.add_column("detail", overflow="fold")
    colour = {"ok": "green", "warn": "yellow", "missing": "red"}
    for c in checks:
        table.add_row(c.name, f"[{colour[c.verdict]}]{c.verdict}[/]", c.detail)
    console.print(table)
    console.print(f"data dir: {st.home}")


config_app = new_typer(help="Inspect the effective configuration; check config files.")
app.add_typer(config_app, name="config")


@config_app.command("show")
def config_show(ctx: typer.Context) -> None:
    """Print the effective config (defaults < forge.toml < --set) as TOML, every key under a comment
    saying what it is."""
    typer.echo(describe_toml(state(ctx).config()), nl=False)


@config_app.command("validate")
def config_validate(
    files: Annotated[list[str], typer.Argument(help="forge.toml files to check (the recipes in examples/, say)")],
) -> None:
    """Load each config file as a run would (defaults < the file) and print `ok` or the one-line error;
    exit 1 if any fails."""
    from openforge.config import load_config
    from openforge.errors import ConfigError

    failed = 0
    for path in files:
        try:
            load_config(path)
        except ConfigError as exc:
            failed += 1
            typer.echo(" ".join(str(exc).split()))  # load_config's errors name the file
        else:
            typer.echo(f"{path}: ok")
    if failed:
        raise typer.Exit(1)


@app.command()
def runs(ctx: typer.Context, limit: Annotated[int, typer.Option(help="how many runs")] = 20) -> None:
    """List runs, newest first."""
    from openforge.readmodel import list_run_rows

    store = state(ctx).store()
    rows = list_run_rows(store, limit=limit)
    table = Table(title=f"runs in {store.where}")
    # The id is what a user copies into the next command: never cut or wrapped, the other columns give way.
    table.add_column("id", no_wrap=True, min_width=max((len(row.run.id) for row in rows), default=2))
    for col in ("kind", "name", "status", "created", "rollouts", "steps"):
        table.add_column(col)
    for row in rows:
        run = row.run
        table.add_row(run.id, run.kind, run.name, run.status, f"{run.created_at:%Y-%m-%d %H:%M:%S}",
                      str(row.n_rollouts), str(row.n_steps))
    console.print(table)


@app.command()
def show(ctx: typer.Context, run_id: Annotated[str, typer.Argument(help="run id, unique prefix, or 'latest'")],
         judgements: Annotated[bool, typer.Option("--judgements", help="list the run's judge calls (newest 50)")] = False,
         rollout: Annotated[Optional[str], typer.Option("--rollout", help="with --judgements: one rollout's judge "
                                                        "calls, with their full prompt and reply")] = None) -> None:
    """Summary of one run: status, rollouts by state, rewards, and the metrics of each train step."""
    from openforge.readmodel import read_run_report

    store = state(ctx).store()
    report = read_run_report(store, run_id)
    run = report.run
    console.print(f"[bold]{run.id}[/] {run.name}  kind={run.kind}  status={run.status}")
    console.print(f"created {run.created_at:%Y-%m-%d %H:%M:%S}  ended {run.ended_at or '-'}  adapter {run.current_adapter or '-'}")
    if run.error:
        console.print(f"[red]error:[/] {run.error}")
    from openforge.rollouts.runner.failures import count_infra_failures, failure_reasons, infra_note, is_failure
    from openforge.rollouts.runner.metrics import summary_headline

    states = ", ".join(f"{k} {v}" for k, v in sorted(report.counts.items())) or "none"
    mean = "-" if report.mean_reward is None else f"{report.mean_reward:.3f}"
    console.print(f"rollouts: {report.n_rollouts} ({states}); mean reward {mean} over {report.n_samples}; "
                  f"{infra_note(count_infra_failures(report.failed))}")
    if run.summary_json and (figures := summary_headline(run.summary_json)):
        console.print(figures, highlight=False)
    if report.judgements[0]:  # tasks with a judge component: its failures are infra failures above
        judged, judge_failed = report.judgements
        console.print(f"judgements: {judged} ({judge_failed} judge failure{'' if judge_failed == 1 else 's'})",
                      highlight=False)
    if judgements or rollout:
        from openforge.forge_cli.judgements import print_judgements

        print_judgements(console, store, run.id, rollout_id=rollout)
    if len(report.by_harness) > 1:  # a run in several harnesses (harness.names): each one's reward
        console.print("by harness: " + ", ".join(
            f"{h} {'-' if m is None else f'{m:.3f}'} over {n}" for h, (n, m) in sorted(report.by_harness.items())),
            highlight=False)
    failures = failure_reasons(report.failed, which=is_failure)
    if failures:
        table = Table(title="failed rollouts by reason", title_justify="left")
        table.add_column("n", justify="right")
        table.add_column("reason", overflow="fold")
        for reason, n in failures:
            table.add_row(str(n), reason)
        console.print(table)
    from openforge.forge_cli.segments import segment_table

    if (prefix := segment_table(store, run)) is not None:
        console.print(prefix)
    steps = report.steps
    if steps:
        table = Table(title="train steps")
        cols = ("step", "loss", "reward_mean", "pass_rate", "kl", "clip_frac", "mismatch_kl", "ratio_max", "grad_norm",
                "tokens_per_s")
        # the engine/trainer mismatch (mean k3 KL, largest ratio pi_old / mu) is in each step's metrics_json
        in_json = {"mismatch_kl": "mismatch_kl", "ratio_max": "mismatch_ratio_max"}

        def value(s: Any, c: str) -> Any:
            return (s.metrics_json or {}).get(in_json[c]) if c in in_json else getattr(s, c)

        mixed = any((s.metrics_json or {}).get("reward_by_harness") for s in steps)
        # The step number is what a user copies (`forge export --step`): never cut, the figures give way.
        table.add_column("step", justify="right", no_wrap=True, min_width=max(len(str(s.step)) for s in steps))
        for col in (*cols[1:], "infra", *(["reward by harness"] if mixed else [])):
            table.add_column(col, justify="right")  # infra: the step's rollouts without a reward, groups dropped
        for s in steps:
            per = (s.metrics_json or {}).get("reward_by_harness") or {}
            table.add_row(*[("-" if value(s, c) is None else f"{value(s, c):.4g}") for c in cols],
                          str((s.metrics_json or {}).get("infra_failures", "-")),
                          *([" ".join(f"{h} {v:.2f}" for h, v in sorted(per.items()))] if mixed else []))
        console.print(table)
        from openforge.forge_cli.staleness import staleness_line

        if (line := staleness_line(steps)) is not None:
            console.print(line, highlight=False)
    summary = run.summary_json
    if summary:
        console.print_json(json.dumps(summary))


@app.command()
def stop(ctx: typer.Context, run_id: Annotated[str, typer.Argument(help="run id, unique prefix, or 'latest'")]) -> None:
    """Ask a running run to stop: its owner process gets SIGTERM and cleans up its sandboxes."""
    from openforge.runs.control import stop_run

    sent = stop_run(state(ctx).store(), run_id)
    if sent.pid is not None:
        typer.echo(f"sent SIGTERM to {sent.pid}, the process driving {sent.run_id}")
    else:
        typer.echo(f"{sent.run_id} had no live owner; marked stopped")


for module in (cmd_engine, cmd_harness, cmd_proxy, cmd_sandbox, cmd_rollouts, cmd_collect, cmd_train, cmd_up, cmd_analyze,
               cmd_sft):
    module.register(app)


def main() -> None:  # pragma: no cover - the console script
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
