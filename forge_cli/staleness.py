"""An asynchronous run (trainer.max_staleness > 0): how late its groups were trained. `forge show`'s
line (`staleness_line`) and the dashboard's panel (`async_panel`).

Read from each train step's `metrics_json` (trainer/buffer.py writes `staleness`, `buffer_depth`,
`versions_in_flight`, `stale_waits`, `failed_groups`; with partial rollouts `rollouts_moved`,
`version_capped`; trainer/data.py `token_staleness`, `spanning_rollouts`, `version_dropped_groups`)
and, for what runs now, from the run's live rollouts by the adapter serving them; nothing for a
synchronous run."""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

from rich.table import Table
from rich.text import Text

from openforge.readmodel import Snapshot
from openforge.trainer.buffer import staleness_of
from openforge.trainer.checkpoint import adapter_version

BAR_WIDTH = 16


def staleness_line(steps: Sequence[Any]) -> str | None:
    stats = [s.metrics_json or {} for s in steps]
    stats = [m for m in stats if "staleness" in m]
    if not stats:
        return None
    hist = staleness_of(stats)
    last = stats[-1]
    in_flight = " ".join(f"v{v}:{n}" for v, n in sorted((int(v), n) for v, n in
                                                          last.get("versions_in_flight", {}).items())) or "none"
    return ("async: groups by versions behind " + " ".join(f"{k}:{n}" for k, n in sorted(hist.items()))
            + f"; steps that waited on a group at the bound {sum(int(m.get('stale_waits', 0)) for m in stats)}"
            + f"; groups dropped as failed {sum(int(m.get('failed_groups', 0)) for m in stats)}"
            + f"; at the last step: buffer depth {last.get('buffer_depth', 0)}, in flight {in_flight}")


def is_async(config: dict[str, Any]) -> bool:
    return int((config.get("trainer") or {}).get("max_staleness") or 0) > 0


def live_versions(snap: Snapshot) -> dict[int | str, int]:
    """Rollouts running now by the version of the adapter that serves them (its name when it is none
    of the run's: a foreign adapter)."""
    out: Counter = Counter()
    for name, n in snap.live_by_adapter.items():
        v = adapter_version(snap.run.id, name)
        out[v if v is not None else str(name)] += n
    return dict(sorted(out.items(), key=lambda kv: (isinstance(kv[0], str), kv[0])))


def _bars(hist: dict[int, int], unit: str) -> Table:
    table = Table.grid(padding=(0, 1))
    table.add_column(justify="right", style="dim")
    table.add_column()
    table.add_column(justify="right")
    top = max(hist.values(), default=0)
    for behind, n in sorted(hist.items()):
        width = max(1, round(BAR_WIDTH * n / top)) if n else 0
        table.add_row(f"{behind} behind", Text("█" * width, style="cyan"), f"{n} {unit}")
    return table


def async_panel(snap: Snapshot) -> Table | None:
    """Versions in flight (now), the staleness histogram (every trained step so far) and buffer depth
    (at the last step); None for a synchronous run."""
    if not is_async(snap.config):
        return None
    k = int(snap.config["trainer"]["max_staleness"])
    stats = [s.metrics_json or {} for s in snap.steps]
    stats = [m for m in stats if "staleness" in m]
    last = stats[-1] if stats else {}
    table = Table.grid(padding=(0, 2))
    table.add_column(style="dim")
    table.add_column()
    live = live_versions(snap)
    current = adapter_version(snap.run.id, snap.run.current_adapter)
    in_flight = "  ".join(f"v{v}: {n}" + (" (now)" if v == current else "") for v, n in live.items()) or "none"
    table.add_row("in flight", Text(f"{in_flight}   bound {k}"))  # rollouts, by the version serving them
    hist = {int(b): int(n) for b, n in staleness_of(stats).items()}
    table.add_row("staleness", _bars(hist, "groups") if hist else Text("no step trained yet", style="dim"))
    tokens: Counter = Counter()
    for m in stats:
        tokens.update({int(b): int(n) for b, n in (m.get("token_staleness") or {}).items()})
    if tokens:  # one line: the screen's side column is short
        table.add_row("tokens", "behind " + "  ".join(f"{b}: {n}" for b, n in sorted(tokens.items())))
    if last:
        waits = sum(int(m.get("stale_waits", 0)) for m in stats)
        failed = sum(int(m.get("failed_groups", 0)) for m in stats)
        # depth: groups done and waiting to be trained at the last step; waits: steps that waited on a
        # group at the bound; failed: groups dropped, every rollout an infrastructure failure
        table.add_row("buffer", f"{last.get('buffer_depth', 0)} groups waiting · bound waits {waits} · failed {failed}")
    if any("rollouts_moved" in m for m in stats):
        moved, capped, dropped, spanning = (sum(int(m.get(key, 0)) for m in stats) for key in
                                            ("rollouts_moved", "version_capped", "version_dropped_groups",
                                             "spanning_rollouts"))
        table.add_row("partial", f"moved {moved} · held at the cap {capped} · groups dropped at the cap {dropped}"
                                 f" · trained rollouts spanning versions {spanning}")
    return table
