"""Commands of the proxy part: `forge proxy` (engine + recording proxy) and `forge calls RUN`."""

from __future__ import annotations

import shutil
import signal
import threading
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from openforge.forge_cli.context import state
from openforge.errors import ConfigError, ForgeError, NotFoundError
from openforge.image_store import ImageStore
from openforge.store import Call

console = Console()


def proxy(
    ctx: typer.Context,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="HF checkpoint folder (default: engine.model, else the tiny model)")] = None,
    engine: Annotated[str, typer.Option("--engine", help="'embedded', 'sglang', or the URL of a running engine")] = "embedded",
    port: Annotated[Optional[int], typer.Option("--port", "-p", help="proxy port (0 = a free one)")] = None,
    host: Annotated[Optional[str], typer.Option("--host", help="address to listen on (default 127.0.0.1)")] = None,
    api_key: Annotated[Optional[str], typer.Option("--api-key", help="the one key to accept (default: a generated one)")] = None,
    workers: Annotated[Optional[int], typer.Option("--workers", min=1, help="proxy processes behind the one port (default: proxy.workers, 1)")] = None,
) -> None:
    """Serve a model behind the recording proxy until Ctrl-C; every call is recorded into a new run."""
    from openforge.engine.model import resolve_model_path
    from openforge.runs.proxy_session import ProxySession

    st = state(ctx)
    proxy_flags = {k: v for k, v in {"port": port, "host": host, "workers": workers}.items() if v is not None}
    engine_flags = {**engine_overrides(engine), **({"model": model} if model else {})}
    config = st.config({"engine": engine_flags, "proxy": proxy_flags})
    model_path = resolve_model_path(config.engine.model)
    config = config.model_copy(update={"engine": config.engine.model_copy(update={"model": str(model_path)})})
    session = ProxySession(config, st.store(), api_key=api_key)
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    started = False
    try:
        session.start()
        started = True
        assert session.run is not None
        typer.echo(f"run {session.run.id}")
        typer.echo(f"proxy {session.url}  (OpenAI base URL {session.url}/v1, Anthropic base URL {session.url})")
        typer.echo(f"api key {session.api_key}")
        if session.key_was is not None:
            typer.echo(f"a new recorded session: the key's earlier one is run {session.key_was.id} "
                       f"({session.key_was.status}), kept as it was")
        typer.echo(f"engine {session.engine_url}  model {model_path}")
        if session.interrupted_on_start:
            typer.echo(f"marked {session.interrupted_on_start} call(s) left in flight by a stopped proxy "
                       "as interrupted")
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        if started:
            stats = session.stop()
            typer.echo(f"stopped; recorded {stats['n_calls']} call(s) into {stats['n_segments']} segment(s) "
                       f"(see `forge calls {session.run.id}`)")


def engine_overrides(engine: str) -> dict[str, Any]:
    """`--engine embedded|sglang|URL` as engine config values."""
    if engine in ("embedded", "sglang"):
        return {"kind": engine}
    if engine.startswith(("http://", "https://")):
        return {"kind": "url", "url": engine}
    raise ConfigError(f"--engine must be 'embedded', 'sglang' or an http(s):// URL, got {engine!r}")


def _decoder(run_config: dict[str, Any] | None) -> Any:
    """The run's tokenizer, if its model folder is still there (decoding is a nicety, not a must)."""
    cfg = run_config or {}
    path = cfg.get("model") or (cfg.get("engine") or {}).get("model")
    if not path:
        return None
    try:
        from openforge.proxy.tokens import load_tokenizer

        return load_tokenizer(path)
    except ForgeError:
        return None


def calls(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="run id, unique prefix, or 'latest'")],
    show: Annotated[Optional[int], typer.Option("--show", help="print call N (its id) with decoded tokens and logprobs")] = None,
    limit: Annotated[int, typer.Option(help="how many calls to list (newest)")] = 50,
    save_images: Annotated[Optional[Path], typer.Option("--save-images", help="with --show: copy the call's images into this folder, named call<ID>-<N>-<sha>.<ext>")] = None,
) -> None:
    """List the model calls recorded for a run, or show one in full (with its images)."""
    store = state(ctx).store()
    run = store.get_run(run_id)
    if show is not None:
        call = store.get_call(show)
        if call.run_id != run.id:
            raise NotFoundError(f"call {show} is not in run {run.id}")
        _show_call(call, _decoder(run.config_json))
        _show_images(call, ImageStore.for_run(state(ctx).home, run.id), save_images)
        return
    if save_images is not None:
        raise ConfigError("--save-images needs --show ID (the call whose images to save)")
    rows = list(reversed(store.list_calls(run_id=run.id, limit=limit, newest_first=True)))
    several = len({c.rollout_id for c in rows}) > 1
    table = Table(title=f"calls of {run.id} ({len(rows)} shown)")
    cols = ["id", *(["rollout"] if several else []), "seq", "api", "status", "in", "out", "reused", "finish",
            "tools", "ms"]
    for col in cols:
        table.add_column(col, justify="right" if col in ("id", "seq", "in", "out", "reused", "ms") else "left")
    for c in rows:
        tools = ",".join(t["name"] for t in (c.tool_calls_json or [])) + (" (malformed)" if c.tool_parse_error else "")
        table.add_row(str(c.id), *([c.rollout_id] if several else []), str(c.seq), _API_SHORT.get(c.api, c.api),
                      c.status, str(c.prompt_tokens), str(c.completion_tokens), str(c.reused_tokens),
                      c.finish_reason or "-", tools or "-", f"{c.latency_ms:.0f}" if c.latency_ms is not None else "-")
    console.print(table)


_API_SHORT = {"openai_chat": "chat", "openai_responses": "responses", "anthropic_messages": "messages"}


def _show_call(call: Call, tokenizer: Any) -> None:
    console.print(f"[bold]call {call.id}[/] rollout {call.rollout_id} seq {call.seq} {call.api} "
                  f"stream={call.stream} status={call.status} finish={call.finish_reason or '-'}")
    console.print(f"prompt {call.prompt_tokens} tokens ({call.reused_tokens} reused from earlier turns), "
                  f"completion {call.completion_tokens} tokens, latency {call.latency_ms or 0:.1f} ms")
    if call.error:
        console.print(f"[red]error:[/] {call.error}")
    ids, lps = call.completion_ids or [], call.logprobs or []
    if tokenizer is not None:
        console.rule("prompt (decoded, last 2000 characters)")
        console.print(tokenizer.decode(call.prompt_ids or [])[-2000:], markup=False, highlight=False)
        console.rule("completion (decoded)")
        console.print(tokenizer.decode(ids), markup=False, highlight=False)
    table = Table(title="completion tokens")
    for col in ("#", "id", "token", "logprob"):
        table.add_column(col, justify="right" if col != "token" else "left")
    for i, (tid, lp) in enumerate(zip(ids, lps + [None] * (len(ids) - len(lps)))):
        text = repr(tokenizer.decode([tid])) if tokenizer is not None else "?"
        table.add_row(str(i), str(tid), text, "-" if lp is None else f"{lp:.4f}")
    console.print(table)


def _show_images(call: Call, images: ImageStore, folder: Path | None) -> None:
    """The call's images in the order of their placeholder runs: where each is stored, its format,
    size and dimensions; copied into `folder` under names that say which call and which image."""
    if not call.images:
        return
    table = Table(title=f"images ({len(call.images)}, in prompt order)")
    for col in ("#", "sha256", "format", "bytes", "size"):
        table.add_column(col, justify="right" if col in ("#", "bytes") else "left")
    saved: list[Path] = []
    files: list[str] = []  # printed whole, one a line, below the table (a table cell would wrap them)
    for i, sha in enumerate(call.images):
        info = images.describe(sha)
        table.add_row(str(i), sha[:12], info.format, str(info.size) if info.path else "-", info.dimensions)
        files.append(f"image {i}: {info.path if info.path else f'{sha[:12]} missing from {images.root}'}")
        if folder is not None and info.path is not None:
            folder.mkdir(parents=True, exist_ok=True)
            dest = folder / f"call{call.id}-{i}-{sha[:12]}.{info.format}"
            shutil.copyfile(info.path, dest)
            saved.append(dest)
    console.print(table, markup=False, highlight=False)
    for line in files:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    if folder is not None:
        console.print(f"saved {len(saved)} image(s) to {folder}", markup=False, highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add this part's commands to the root app."""
    app.command("proxy")(proxy)
    app.command("calls")(calls)
