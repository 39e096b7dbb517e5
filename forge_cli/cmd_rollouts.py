"""Commands of the rollouts part: `forge tasks validate|list` and `forge eval`."""

from __future__ import annotations

import asyncio
import inspect
from collections import Counter
from typing import Annotated, Any, Optional

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from openforge.forge_cli.context import new_typer, state
from openforge.config import ForgeConfig
from openforge.errors import ConfigError, TaskError
from openforge.rollouts.runner.metrics import RunMetrics, summary_headline
from openforge.rollouts.tasks.format import load_tasks, validate_tasks
from openforge.rollouts.tasks.importing import check_some_imported
from openforge.rollouts.tasks.kinds import TaskKindBase, check_run, import_formats, importer_of, kinds_of
from openforge.rollouts.tasks.setup_files import SetupLimits
from openforge.sandbox.limits import storage_notice

console = Console()
tasks_app = new_typer(help="Check and list task sets (a .jsonl file, a folder, or 'builtin').")

PathArg = Annotated[str, typer.Argument(help="a task .jsonl file, a task folder, a Harbor dataset folder, 'builtin' or 'builtin-web'")]


@tasks_app.command("validate")
def tasks_validate(
    ctx: typer.Context,
    path: PathArg,
    run: Annotated[bool, typer.Option("--run", help="also run each task's reference solution and six hostile answers "
                                                    "(a Harbor task: and a forged reward file, and a conftest.py, pytest.py and "
                                                    "pytest.ini planted everywhere it can write; a task graded on its services' "
                                                    "record: and a forged dispatch log; an OSWorld-format task: junk planted "
                                                    "where its getters read) in sandboxes "
                                                    "(sandbox.type): the first must pass, the others score 0; a "
                                                    "task with no reference meets the hostile answers and an idle "
                                                    "agent")] = False,
) -> None:
    """Check a task set; print every bad task with its reason (exit 1 if any)."""
    limits = SetupLimits.of(state(ctx).config().tasks)
    problems = validate_tasks(path, limits=limits)
    if problems:
        for p in problems:
            typer.echo(f"{p}", err=True)
        raise TaskError(f"{len(problems)} problem(s) in {path}")
    tasks = load_tasks(path, limits=limits)
    if run:
        from openforge.rollouts.tasks.selfcheck import check_solutions, unchecked_note

        st = state(ctx)
        problems = asyncio.run(check_solutions(st.store(), st.config(), tasks))
        if note := unchecked_note(tasks):
            typer.echo(note, err=True)
        for p in problems:
            typer.echo(f"{p}", err=True)
        if problems:
            raise TaskError(f"{len({p.task_id for p in problems})} task(s) of {path} failed the solution check")
    levels = Counter(t.difficulty or "-" for t in tasks)
    checked = ", solutions checked" if run else ""
    typer.echo(f"{path}: {len(tasks)} task(s) ok ({', '.join(f'{k} {v}' for k, v in sorted(levels.items()))}{checked})")
    if sized := [t.id for t in tasks if t.limits is not None and t.limits.storage_mb is not None]:
        typer.echo(storage_notice(sized, state(ctx).config().sandbox.type))


def tasks_import(fmt: str, src: str, out: str = "", **options: Any) -> None:
    """Convert a task set of another format into forge task folders; print each refused task and the counts."""
    kind = importer_of(fmt)
    result = kind.import_tasks(src, out, fmt=fmt, options={o.name: options.get(o.name, o.default)
                                                           for o in kind.import_options})
    for where, why in [*result.refused, *result.notes]:
        typer.echo(f"{where}: {why}", err=True)
    check_some_imported(src, result)
    typer.echo(result.summary)


def _import_parameters() -> list[inspect.Parameter]:
    """`forge tasks import`'s arguments and options as the families declare them (rollouts/tasks/importing.py):
    each format with what it reads, and each option only some importer reads, with the formats that read it."""
    by_kind: dict[str, tuple[TaskKindBase, list[str]]] = {}
    for fmt, kind in import_formats().items():
        by_kind.setdefault(kind.name, (kind, []))[1].append(fmt)
    kinds = sorted(by_kind.values(), key=lambda kv: kv[1][0])
    formats = [f"{' or '.join(fmts)} ({kind.import_help})" for kind, fmts in kinds]
    sources = [kind.import_source for kind, _ in kinds if kind.import_source]
    outs: dict[str, list[str]] = {}
    for kind, fmts in kinds:
        if kind.import_out:
            outs.setdefault(kind.import_out, []).extend(fmts)
    written = "; ".join(", ".join(fmts) + f": {what}" for what, fmts in outs.items())
    out_help = "folder to write the forge tasks to, one task folder each" + (f" ({written})" if written else "")

    def param(name: str, annotation: Any, default: Any = inspect.Parameter.empty) -> inspect.Parameter:
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)

    params = [
        param("fmt", Annotated[str, typer.Argument(metavar="FORMAT", help=(
            f"the source's format: {', '.join(formats)}, or the name of a task family with an importer "
            "(docs/tasks.md, \"Adding a task format\")"))]),
        param("src", Annotated[str, typer.Argument(help=f"the source: {'; '.join(sources)}")]),
        param("out", Annotated[str, typer.Option("--out", help=out_help)], ""),
    ]
    for kind, fmts in kinds:
        for option in kind.import_options:
            if option.name in {p.name for p in params}:
                continue  # declared by an earlier family too: one option, each importer reads it
            kind_of_value = Optional[list[str]] if option.repeatable else Optional[str]
            params.append(param(option.name, Annotated[kind_of_value, typer.Option(
                option.flag, help=f"{', '.join(fmts)}: {option.help}")], option.default))
    return params


# The command is the families' (rollouts/tasks/kinds.py `import_formats`): the signature typer reads is theirs.
tasks_import.__signature__ = inspect.Signature(_import_parameters())  # type: ignore[attr-defined]
tasks_app.command("import")(tasks_import)


@tasks_app.command("list")
def tasks_list(path: Annotated[str, typer.Argument(help="a task .jsonl file, a task folder, a Harbor dataset folder, 'builtin' or 'builtin-web'")] = "builtin",
               ) -> None:
    """List the tasks of a set: id, difficulty, time limit, tags, instruction."""
    table = Table(title=f"tasks in {path}")
    for col in ("id", "difficulty", "limit", "tags", "instruction"):
        table.add_column(col, overflow="fold")
    for t in load_tasks(path):
        table.add_row(t.id, t.difficulty or "-", f"{t.time_limit_s:g}s", ",".join(t.tags), t.instruction)
    console.print(table)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def metrics_table(metrics: RunMetrics, title: str) -> Table:
    """The eval table: one row per task, then the run's means over tasks. Usage (calls, tokens, wall
    time) goes in the caption: it keeps the table inside 80 columns. Per-task usage is in the summary."""
    ks = metrics.k_values
    caption = (f"p@k = pass@k, p^k = pass^k (unbiased, from n samples); {metrics.calls} calls, "
               f"{metrics.tokens} tokens, {metrics.wall_s:.0f} s of rollouts")
    table = Table(title=title, caption=caption, box=box.SIMPLE_HEAD)
    table.add_column("task", no_wrap=True, overflow="ellipsis", max_width=32)
    for col in ("n", "pass", "mean", *[f"p@{k}" for k in ks], *[f"p^{k}" for k in ks]):
        table.add_column(col, justify="right", no_wrap=True)

    def cells(m) -> list[str]:  # noqa: ANN001 - a TaskMetrics or the RunMetrics
        return [_fmt(m.mean_reward), *[_fmt(m.pass_at[k]) for k in ks], *[_fmt(m.pass_hat[k]) for k in ks]]

    for t in sorted(metrics.tasks, key=lambda t: t.task_id):
        n = f"{t.n}+{t.n_infra_failed}!" if t.n_infra_failed else str(t.n)  # ! = infra failures left out
        table.add_row(t.task_id, n, str(t.n_pass), *cells(t))
    table.add_section()
    failed = f"+{metrics.n_infra_failed}!" if metrics.n_infra_failed else ""
    table.add_row("[bold]all tasks[/]", f"{metrics.n_rollouts - metrics.n_infra_failed}{failed}",
                  str(sum(t.n_pass for t in metrics.tasks)), *cells(metrics))
    return table


def _interval(estimate: dict | None, *, change: bool = False) -> str:
    """An Estimate (as stored) as "0.42" over "[0.30, 0.55]" (two lines: a table of three figures stays
    inside 80 columns), a change signed: "+0.10" over "[-0.05, +0.25]"."""
    if not estimate or estimate.get("mean") is None:
        return "-"
    f = "{:+.2f}" if change else "{:.2f}"
    return f"{f.format(estimate['mean'])}\n[{f.format(estimate['lo'])}, {f.format(estimate['hi'])}]"


def harness_table(rows: list[dict], title: str, *, change: bool = False) -> Table:
    """harness x figure: each figure's mean over tasks with its 95% bootstrap interval over tasks
    (rollouts/analysis/eval_figures.py); `change`: the rows of a comparison, one run less the other."""
    caption = ("difference of the means over the tasks both runs have, paired by task; n = tasks paired"
               if change else "mean over tasks [95% bootstrap interval over tasks]; n = samples (+ infra failures "
               "left out)")
    table = Table(title=title, caption=caption, box=box.SIMPLE_HEAD)
    table.add_column("harness", no_wrap=True, overflow="ellipsis", max_width=24)
    table.add_column("n", justify="right", no_wrap=True)
    figures = list(rows[0]["figures"]) if rows else []
    for figure in figures:
        table.add_column(figure, justify="right", no_wrap=True)
    for row in rows:
        n = (str(row["n_paired"]) if change else
             f"{row['n_samples']}+{row['n_infra_failed']}!" if row["n_infra_failed"] else str(row["n_samples"]))
        table.add_row(row["harness"], n, *[_interval(row["figures"].get(f), change=change) for f in figures])
    return table


def eval_cmd(
    ctx: typer.Context,
    tasks: Annotated[Optional[str], typer.Option("--tasks", "-t", help="task set (default: tasks.path, 'builtin')")] = None,
    samples: Annotated[Optional[int], typer.Option("--samples", "-k", help="samples per task (default runner.samples_per_task)")] = None,
    pass_k: Annotated[Optional[list[int]], typer.Option("--pass-k", help="k of pass@k / pass^k (repeatable; default runner.pass_k)")] = None,
    include: Annotated[Optional[list[str]], typer.Option("--task", help="only this task id (repeatable)")] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", help="only the first N tasks")] = None,
    harness: Annotated[Optional[str], typer.Option("--harness", help="mini, claude-code, codex, openclaw, zeroclaw, mini-gui, browser-use; "
                                                   "several separated by commas (mini,codex): every task runs in each, "
                                                   "and a harness x figure table is printed")] = None,
    sandbox: Annotated[Optional[str], typer.Option("--sandbox", help="local, docker or kubernetes")] = None,
    concurrency: Annotated[Optional[int], typer.Option("--concurrency", help="rollouts at once")] = None,
    model: Annotated[Optional[str], typer.Option("--model", help="HF checkpoint dir (default: the tiny model)")] = None,
    engine_url: Annotated[Optional[str], typer.Option("--engine-url", help="use an engine already running here")] = None,
    adapter: Annotated[Optional[str], typer.Option("--adapter", help="a LoRA adapter to evaluate: a folder, a run whose final adapter it is (e.g. an sft or train run), or a name the engine at --engine-url already serves")] = None,
    name: Annotated[str, typer.Option("--name", help="a name for the run")] = "",
    compare: Annotated[Optional[str], typer.Option("--compare", help="an earlier eval run (id or prefix): print this "
                                                   "eval's figures less its, paired by task, with 95% intervals "
                                                   "(two adapters, base and trained)")] = None,
) -> None:
    """Run a task set with k samples per task; print pass@k / pass^k per task and per harness, with 95%
    bootstrap intervals over tasks, and store the tables."""
    overrides: dict = {"runner": {}, "harness": {}, "sandbox": {}, "engine": {}, "tasks": {}}
    for section, key, value in (("runner", "samples_per_task", samples), ("runner", "pass_k", pass_k),
                                ("runner", "concurrency", concurrency), ("harness", "name", harness),
                                ("sandbox", "type", sandbox), ("engine", "model", model), ("tasks", "path", tasks),
                                ("tasks", "include", include)):
        if value:
            overrides[section][key] = value
    if harness and "," in harness:  # several: harness.names, every task run in each
        del overrides["harness"]["name"]
        overrides["harness"]["names"] = [h.strip() for h in harness.split(",") if h.strip()]
    if engine_url:
        overrides["engine"].update(kind="url", url=engine_url)
    st = state(ctx)
    config = st.config(overrides)
    task_set = load_tasks(config.tasks.path, include=config.tasks.include,
                          limits=SetupLimits.of(config.tasks))[: limit or None]
    if not task_set:
        raise ConfigError("the task selection is empty")
    check_run(task_set, config)  # before any engine starts (online-only tasks, say)
    from openforge.runs.evaluate import evaluate

    k = config.runner.samples_per_task
    harnesses = list(config.harness.weights())  # with harness.names, every task runs in each

    def started(config: ForgeConfig, proxy_url: str) -> None:
        console.print(f"eval: {len(task_set)} task(s) x {k} sample(s), harness {', '.join(harnesses)}, "
                      f"sandbox {config.sandbox.type}, proxy {proxy_url}")

    try:
        run, metrics = evaluate(st.store(), config, task_set, home=st.home, name=name, adapter=adapter,
                                on_start=started, on_progress=rollout_printer(len(task_set) * k * len(harnesses)),
                                compare=compare)
    except KeyboardInterrupt:
        typer.echo("forge: eval interrupted; every sandbox was stopped", err=True)
        raise typer.Exit(130) from None
    console.print(metrics_table(metrics, f"eval {run.id}: {config.tasks.path}"))
    console.print(metrics.headline(), highlight=False)
    for harness, figures in sorted(((run.summary_json or {}).get("by_harness") or {}).items()):
        console.print(f"{harness}: mean reward {_fmt(figures.get('mean_reward'))}, {summary_headline(figures)}",
                      highlight=False)
    summary = run.summary_json or {}
    console.print(harness_table(summary.get("harness_figures") or [], f"eval {run.id} by harness"))
    if "compare" in summary:
        console.print(harness_table(summary["compare"]["by_harness"],
                                    f"eval {run.id} less eval {summary['compare']['run']}", change=True))
    for kind, _ in kinds_of(task_set).values():  # a family's own scoring (an imported benchmark's), as it says it
        for line in kind.summary_lines(summary):
            console.print(line, highlight=False)


def rollout_printer(total: int):  # noqa: ANN202
    done = 0

    def progress(rollout) -> None:  # noqa: ANN001
        nonlocal done
        if rollout.status in ("pending", "running"):
            return
        done += 1
        reward = "-" if rollout.reward is None else f"{rollout.reward:.2f}"
        note = f"  {rollout.error[:90]}" if rollout.error else ""
        console.print(f"[{done}/{total}] {rollout.task_id}#{rollout.sample_index} {rollout.status} reward {reward}{note}",
                      highlight=False)

    return progress


def register(app: typer.Typer) -> None:
    """Add this part's commands to the root app."""
    app.add_typer(tasks_app, name="tasks")
    app.command("eval")(eval_cmd)
