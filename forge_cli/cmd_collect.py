"""`forge collect`: SFT data by rejection sampling, a teacher (engine.kind = "remote") driving the harness
on a task set k times a task (runs/collect.py; docs/trainer.md, "SFT before RL")."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from openforge.config import ForgeConfig
from openforge.forge_cli.context import state
from openforge.forge_cli.overrides import flag_overrides
from openforge.forge_cli.cmd_rollouts import rollout_printer
from openforge.errors import ConfigError

console = Console()


def collect_cmd(
    ctx: typer.Context,
    tasks: Annotated[Optional[str], typer.Option("--tasks", "-t", help="task set (default: tasks.path, 'builtin')")] = None,
    samples: Annotated[Optional[int], typer.Option("--samples", "-k", min=1, help="samples per task "
                                                   "(default runner.samples_per_task)")] = None,
    include: Annotated[Optional[list[str]], typer.Option("--task", help="only this task id (repeatable)")] = None,
    harness: Annotated[Optional[str], typer.Option("--harness", help="the harness the teacher drives (harness.name)")] = None,
    concurrency: Annotated[Optional[int], typer.Option("--concurrency", min=1, help="rollouts at once")] = None,
    min_reward: Annotated[float, typer.Option("--min-reward", min=0.0, max=1.0, help="keep rollouts scored at least this, in [0, 1] "
                                              "(what forge sft --from RUN trains on)")] = 1.0,
    resume: Annotated[Optional[str], typer.Option("--resume", metavar="RUN", help="continue a collect run: only the "
                                                  "samples it has not scored yet are taken")] = None,
    name: Annotated[Optional[str], typer.Option("--name", help="a name for the run")] = None,
) -> None:
    """Record a teacher (engine.kind = "remote", or any engine) driving the harness on a task set, k
    samples a task, graded as in eval and RL; count the rollouts that reach --min-reward, per task and
    per harness. `forge sft --from RUN` then trains the student on those."""
    from openforge.runs.collect import collect

    flags = {"tasks.path": tasks, "runner.samples_per_task": samples, "tasks.include": include,
             "harness.name": harness, "runner.concurrency": concurrency, "name": name}
    if resume is not None and any(v is not None for v in flags.values()):
        raise ConfigError("--resume continues a collect run with its stored config; only --min-reward may change")
    st = state(ctx)
    config = st.config(flag_overrides(flags))
    progress = None

    def started(config: ForgeConfig, proxy_url: str, n: int) -> None:
        nonlocal progress
        progress = rollout_printer(n)
        teacher = config.engine.upstream_model if config.engine.kind == "remote" else config.engine.model  # type: ignore[union-attr]
        console.print(f"collect: {n} rollout(s) to sample, harness {', '.join(config.harness.weights())}, "
                      f"engine {config.engine.kind} ({teacher}), proxy {proxy_url}", highlight=False)

    try:
        run, counts = collect(st.store(), config, home=st.home, min_reward=min_reward, name=name or "",
                              resume=resume, on_start=started, on_progress=lambda r: progress and progress(r))
    except KeyboardInterrupt:
        typer.echo("forge: collect interrupted; every sandbox was stopped (continue it with --resume)", err=True)
        raise typer.Exit(130) from None
    table = Table(title=f"collect {run.id}: kept = reward >= {min_reward:g}", box=box.SIMPLE_HEAD)
    for col in ("task", "scored", "kept"):
        table.add_column(col, justify="left" if col == "task" else "right")
    for task_id, tally in sorted(counts["kept_by_task"].items()):
        table.add_row(task_id, str(tally["scored"]), str(tally["kept"]))
    table.add_section()
    for harness_name, tally in sorted(counts["kept_by_harness"].items()):
        table.add_row(f"[bold]harness {harness_name}[/]", str(tally["scored"]), str(tally["kept"]))
    console.print(table)
    console.print(f"kept {counts['kept']} of {counts['rollouts']} scored rollout(s); train on them: "
                  f"forge sft --from {run.id}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("collect")(collect_cmd)
