"""Commands of the sandbox part: `forge gc` and `forge sandbox build-image`."""

from __future__ import annotations

from typing import Annotated, Optional

import psutil
import typer

from openforge.forge_cli.context import new_typer, state
from openforge.store import RUN_FINAL

sandbox_app = new_typer(help="Sandbox images and housekeeping.")


def _live_runs(store) -> set[str]:  # type: ignore[no-untyped-def]
    """Runs that may still own sandboxes: not finished, and their owner process (if any) alive."""
    return {r.id for r in store.list_runs(limit=100000)
            if r.status not in RUN_FINAL and (r.owner_pid is None or psutil.pid_exists(r.owner_pid))}


def _run_of(store, rollout_id: str) -> str | None:  # type: ignore[no-untyped-def]
    """The run a rollout belongs to, as the store (which no sandbox can write) says; None if unknown."""
    from openforge.errors import NotFoundError

    try:
        return store.get_rollout(rollout_id).run_id
    except NotFoundError:
        return None


def gc(ctx: typer.Context,
       run: Annotated[Optional[str], typer.Option("--run", help="only this run's sandboxes (removed even if it looks live)")] = None,
       dry_run: Annotated[bool, typer.Option("--dry-run", help="list what would be removed, remove nothing")] = False,
       kubernetes: Annotated[bool, typer.Option("--kubernetes", help="also sweep pods when sandbox.type is not kubernetes")] = False,
       ) -> None:
    """Remove sandboxes (folders, processes, cgroups, containers, pods) that crashed runs left, by label, and
    the host-side folders (task services, tool servers) whose maker died."""
    from openforge.sandbox.gc import collect_all

    st = state(ctx)
    store = st.store()
    run_id = store.get_run(run).id if run else None
    live = _live_runs(store)
    found, notes = collect_all(st.config().sandbox, home=st.home, run_id=run_id, is_live=live.__contains__,
                               live_runs=bool(live), dry_run=dry_run, kubernetes=kubernetes,
                               run_of=lambda rollout: _run_of(store, rollout))
    verb = "would remove" if dry_run else "removed"
    for item in found:
        typer.echo(f"{verb} {item.backend} {item.ident} (run {item.run_id or '?'})")
    for note in notes:
        typer.echo(note)
    typer.echo(f"{len(found)} leftover sandbox(es) {verb}; {len(live)} live run(s) left alone")


@sandbox_app.command("build-image")
def build_image(ctx: typer.Context,
                variant: Annotated[str, typer.Option(help="python (Debian + python3 + openai SDK), browser (python + chromium, Xvfb, xdotool, fonts), desktop (python + Xvfb, xdotool, fonts and --packages) or busybox (shell only)")] = "python",
                packages: Annotated[str, typer.Option(help="Debian packages a desktop task's applications come in, for --variant desktop, e.g. libreoffice-calc,vlc")] = "",
                harness: Annotated[str, typer.Option(help="harnesses to put in the image (installed into harness.npm_cache "
                                                          "first if missing): npm ones together on the python image, e.g. "
                                                          "claude-code,codex,opencode; a Python one alone in an image of its "
                                                          "own, e.g. mini-swe-agent (python image) or browser-use (browser image)")] = "",
                latest: Annotated[bool, typer.Option(help="also tag it openforge-sandbox:latest (the default image)")] = True,
                ) -> None:
    """Build the Docker sandbox image locally (debootstrap or busybox, then docker import); cached by recipe hash."""
    from openforge.sandbox.container_images import ensure_image

    config = state(ctx).config()
    base_url = getattr(config.sandbox, "base_url", "")
    if harness:
        from openforge.rollouts.harnesses.container_images import build_harness_image
        from openforge.rollouts.harnesses.npm import npm_cache_dir

        names = [name.strip() for name in harness.split(",") if name.strip()]
        tag = build_harness_image(names, npm_cache_dir(config.harness), base_url=base_url, tag_latest=latest)
    else:
        extra = tuple(p.strip() for p in packages.split(",") if p.strip())
        tag = ensure_image(variant, base_url=base_url, tag_latest=latest, packages=extra)
    typer.echo(tag + ("  (also openforge-sandbox:latest)" if latest else ""))
    if harness and not latest:
        typer.echo(f"use it with: --set sandbox.type=docker --set sandbox.image={tag}")


def register(app: typer.Typer) -> None:
    """Add this part's commands to the root app."""
    app.command("gc")(gc)
    app.add_typer(sandbox_app, name="sandbox")
