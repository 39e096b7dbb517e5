"""`forge show`'s per-harness view of how rollouts used the prefix: calls per rollout, sampled tokens
reused from earlier turns, segments per rollout, and why each prefix break happened (call.break_reason,
proxy/breaks.py)."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from rich.table import Table


def segment_table(store: Any, run: Any) -> Table | None:
    """The table for `run`, or None when it has no recorded calls."""
    calls = store.list_calls(run_id=run.id)
    if not calls:
        return None
    default = ((run.config_json or {}).get("harness") or {}).get("name", "?")
    harness_of = {r.id: (r.harness or default) for r in store.list_rollouts(run.id)}
    per: dict[str, dict[str, Any]] = defaultdict(lambda: {"rollouts": set(), "calls": 0, "prompt": 0,
                                                          "reused": 0, "breaks": Counter()})
    segments: dict[str, int] = {}
    for call in calls:
        row = per[harness_of.get(call.rollout_id, default)]
        row["rollouts"].add(call.rollout_id)
        row["calls"] += 1
        row["prompt"] += call.prompt_tokens
        row["reused"] += call.reused_tokens
        if call.break_reason:
            row["breaks"][call.break_reason.split(":")[0]] += 1
        # A rollout's first call opens a segment; each break opens another.
        segments[call.rollout_id] = segments.get(call.rollout_id, 0) + (call.seq == 0 or bool(call.break_reason))
    table = Table(title="prefix use by harness", title_justify="left")
    for col in ("harness", "rollouts", "calls/rollout", "prompt tokens", "reused", "segments/rollout"):
        table.add_column(col, justify="right")
    table.add_column("breaks", overflow="fold")
    for name, row in sorted(per.items()):
        n = len(row["rollouts"])
        segs = sum(segments[r] for r in row["rollouts"])
        breaks = ", ".join(f"{why} x{k}" for why, k in row["breaks"].most_common()) or "none"
        table.add_row(name, str(n), f"{row['calls'] / n:.2f}", str(row["prompt"]), str(row["reused"]),
                      f"{segs / n:.2f}", breaks)
    return table
