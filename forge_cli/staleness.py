"""`forge show`'s line for an asynchronous run (trainer.max_staleness > 0): how late its groups were trained.

Read from each train step's `metrics_json` (trainer/buffer.py writes `staleness`, `buffer_depth`,
`versions_in_flight`, `stale_waits`, `failed_groups`); nothing for a synchronous run."""

from __future__ import annotations

from typing import Any, Sequence

from openforge.trainer.buffer import staleness_of


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
