"""forge_cli/segments.py: `forge show`'s per-harness table of how rollouts used the prefix (the break reasons are
proxy/breaks.py's, tested in tests/proxy/test_proxy_breaks.py)."""

from __future__ import annotations

from rich.console import Console

from openforge.forge_cli.segments import segment_table
from openforge.proxy import breaks
from openforge.store import Call, Store


def test_forge_show_counts_calls_segments_and_break_reasons_per_harness(tmp_path) -> None:
    store = Store(tmp_path / "forge.db")
    run = store.create_run(config={"harness": {"name": "claude-code"}})
    for i, reasons in enumerate([[None, None, breaks.THINKING_DROPPED], [None, breaks.COMPACTED]]):
        ro = store.create_rollout(run_id=run.id, task_id="t", sample_index=i, harness="claude-code")
        for seq, reason in enumerate(reasons):
            store.add_call(Call(run_id=run.id, rollout_id=ro.id, seq=seq, status="ok", prompt_tokens=100,
                                reused_tokens=10 * seq, break_reason=reason))
    console = Console(width=200, record=True)
    console.print(segment_table(store, store.get_run(run.id)))
    [row] = [line for line in console.export_text().splitlines() if "claude-code" in line]
    cells = [c.strip() for c in row.split("│") if c.strip()]
    # 5 calls over 2 rollouts; 2 opening segments + 2 breaks = 4 segments over 2 rollouts.
    assert cells == ["claude-code", "2", "2.50", "500", "40", "2.00", "thinking dropped x1, compaction x1"]


def test_a_run_without_calls_has_no_table(tmp_path) -> None:
    store = Store(tmp_path / "forge.db")
    run = store.create_run(config={})
    store.create_rollout(run_id=run.id, task_id="t", sample_index=0, harness="codex")
    assert segment_table(store, store.get_run(run.id)) is None
