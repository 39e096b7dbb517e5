"""`forge harness list|show|install|check`: the harnesses this machine knows (specs in ./harnesses/,
$FORGE_HOME/harnesses/, installed adapters, the built-ins), what one is, its install into the harness
cache, and one tiny rollout through the proxy that says everything wrong with it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from openforge.forge_cli.context import new_typer, state

harness_app = new_typer(help="Agent harnesses: list them, show one, install one into the harness cache, check one.")

CACHE_HELP = "the harness cache folder (default: harness.npm_cache, else $FORGE_NPM_CACHE, else $FORGE_HOME/npm)"


def _harness_class(name: str) -> type:
    """The adapter class, or a usage error (exit 2) naming what is known."""
    from openforge.rollouts.harnesses import harness_class
    from openforge.rollouts.harnesses.spec import HarnessSpecError

    try:
        return harness_class(name)
    except HarnessSpecError:
        raise  # a spec that does not load: one line naming the file and the field (exit 1)
    except Exception as exc:  # noqa: BLE001 - HarnessError: an unknown name is the user's typo
        raise typer.BadParameter(str(exc), param_hint="NAME") from None


@harness_app.command("list")
def list_(ctx: typer.Context) -> None:
    """Every harness known here, where it comes from, and whether this machine can run it."""
    from openforge.rollouts.harnesses import harness_class, harness_names
    from openforge.rollouts.harnesses.spec_harness import SpecHarness

    config = state(ctx).config()
    for name in harness_names():
        try:
            cls = harness_class(name)
        except Exception as exc:  # noqa: BLE001 - a broken spec or package is listed with its error
            typer.echo(f"{name:16} error: {exc}")
            continue
        source = str(cls.spec.path) if issubclass(cls, SpecHarness) else f"{cls.__module__}.{cls.__name__}"
        api = cls.spec.api.flavour if issubclass(cls, SpecHarness) else "-"
        fix = cls.available(config.model_copy(update={"harness": config.harness.model_copy(update={"name": name})}))
        typer.echo(f"{name:16} {api:17} {'ready' if fix is None else 'not installed':14} {source}")


@harness_app.command("show")
def show(ctx: typer.Context, name: Annotated[str, typer.Argument(help="a harness name or a spec file's path")]) -> None:
    """A harness's spec (or, for a Python adapter, where it lives), and what it would run. A spec is only
    read: its `hook` module is not imported (a spec from elsewhere is its author's code)."""
    from openforge.rollouts.harnesses import find_spec

    spec = find_spec(name)
    if spec is None:
        cls = _harness_class(name)
        typer.echo(f"{cls.name}: a Python adapter, {cls.__module__}.{cls.__name__}")
        typer.echo((cls.__doc__ or "").strip())
        return
    typer.echo(f"# {spec.path}")
    typer.echo(spec.path.read_text(encoding="utf-8").rstrip())


@harness_app.command("install")
def install(ctx: typer.Context,
            name: Annotated[str, typer.Argument(help="a harness name (forge harness list) or a spec file's path")],
            cache: Annotated[Optional[Path], typer.Option("--cache", help=CACHE_HELP)] = None) -> None:
    """Install a harness into the cache the local sandbox runs it from (a no-op if it is there)."""
    from openforge.rollouts.harnesses.npm import npm_cache_dir

    harness = state(ctx).config().harness
    folder = cache.expanduser().resolve() if cache else npm_cache_dir(harness)
    cls = _harness_class(name)
    with Console(stderr=True).status(f"installing {cls.name} into {folder}") as status:
        exe = cls.install(folder, on_line=lambda line: status.update(f"installing {cls.name} into {folder}  {line[-60:]}"))
    typer.echo(f"{cls.name} ready: {exe}")
    if cache and not harness.npm_cache:
        typer.echo(f"use it with: --set harness.npm_cache={folder}  (or export FORGE_NPM_CACHE={folder})")


@harness_app.command("check")
def check(ctx: typer.Context,
          name: Annotated[str, typer.Argument(help="a harness name (forge harness list) or a spec file's path")],
          cache: Annotated[Optional[Path], typer.Option("--cache", help=CACHE_HELP)] = None,
          demo: Annotated[bool, typer.Option("--demo", help="under `forge up --demo`'s settings (its context, "
                                             "tokens per call), as a run with --demo would use them")] = False) -> None:
    """Run one tiny rollout of the harness through the proxy (on the configured model, else the tiny one)
    under the settings a run would use, and print every problem it showed, its refused calls, its first
    main request's prompt tokens, and the answer it read beside its score. Exit 1 when any problem."""
    from openforge.runs.harness_check import check_harness

    _harness_class(name)
    st = state(ctx)
    # --demo's preset is picked by the harness (demo-<harness>.toml over demo.toml), as `forge up --demo` picks it
    config = st.config({"harness": {"name": name}}, preset="demo") if demo else st.config()
    updates = {"name": name, "spec": ""} | ({"npm_cache": str(cache.expanduser().resolve())} if cache else {})
    config = config.model_copy(update={"harness": config.harness.model_copy(update=updates)})
    with Console(stderr=True).status(f"checking {name}: one rollout through the proxy"):
        report = check_harness(st.store(), config, home=st.home)
    tokens = f"{report.first_prompt_tokens:,}" if report.first_prompt_tokens else "-"
    side = f", {report.side_calls} side call(s)" if report.side_calls else ""
    typer.echo(f"{report.harness}: {report.calls} model call(s) ({', '.join(report.apis) or 'none'}){side}, "
               f"{report.refused} refused for length, first prompt {tokens} tokens, {report.seconds:.1f} s")
    if report.answer is not None:
        score = "-" if report.score is None else f"{report.score:g}"
        typer.echo(f"  answer read: {report.answer}, score {score} (asked for the word ok)")
    for warning in report.warnings:
        typer.echo(f"  warning: {warning}")
    for problem in report.problems:
        typer.echo(f"  problem: {problem}")
    if report.problems:
        raise typer.Exit(1)
    typer.echo("  ok")


def register(app: typer.Typer) -> None:
    """Add this part's commands to the root app."""
    app.add_typer(harness_app, name="harness")
