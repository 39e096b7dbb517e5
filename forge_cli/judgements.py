"""`forge show RUN --judgements`: each judge call of a run, or of one rollout, as a person reads it.

A row says which rollout, which model, what the judge was shown (its screenshots are the run's image
files, named by the `forge-image:<sha256>` references the store keeps in place of their bytes), its
reply's last line and the score, or why there is none. With `--rollout ID` the full prompt and reply.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from openforge.readmodel import read_judgements
from openforge.store import Judgement, Store

IMAGE_REFERENCE = "forge-image:"


def _images(row: Judgement) -> list[str]:
    """The sha256 ids of the screenshots the judge was shown, in order."""
    return [part["image_url"]["url"][len(IMAGE_REFERENCE):] for message in row.prompt_json or []
            if isinstance(message.get("content"), list) for part in message["content"]
            if part.get("type") == "image_url" and part["image_url"]["url"].startswith(IMAGE_REFERENCE)]


def print_judgements(console: Console, store: Store, run_id: str, *, rollout_id: str | None = None) -> None:
    rows = read_judgements(store, run_id, rollout_id=rollout_id)
    if not rows:
        console.print("no judgements" + (f" for rollout {rollout_id}" if rollout_id else ""))
        return
    table = Table(title="judgements (newest 50)" if rollout_id is None else f"judgements of {rollout_id}",
                  title_justify="left")
    for col in ("rollout", "model", "shown", "score", "ms", "reply / error"):
        table.add_column(col, overflow="fold", justify="right" if col in ("score", "ms") else "left")
    for row in rows:
        shots = len(_images(row))
        last = (row.reply or "").strip().splitlines()[-1:] or [""]
        table.add_row(row.rollout_id[:12], row.model, f"{shots} screenshots",
                      "-" if row.score is None else f"{row.score:g}",
                      "-" if row.latency_ms is None else f"{row.latency_ms:.0f}",
                      f"[red]{row.error}[/]" if row.error else last[0][:200])
    console.print(table)
    if rollout_id is not None:
        for row in rows:
            _print_prompt(console, row)


def _print_prompt(console: Console, row: Judgement) -> None:
    for message in row.prompt_json or []:
        console.rule(f"judge prompt: {message.get('role', '?')}")
        content: Any = message.get("content")
        for part in content if isinstance(content, list) else [{"type": "text", "text": content}]:
            if part.get("type") == "image_url":
                console.print(f"[image {part['image_url']['url']}]", highlight=False, markup=False, soft_wrap=True)
            else:
                console.print(part.get("text", ""), highlight=False, markup=False, soft_wrap=True)
    console.rule("judge reply")
    console.print(row.reply if row.reply is not None else f"(none: {row.error})", highlight=False, markup=False,
                  soft_wrap=True)
