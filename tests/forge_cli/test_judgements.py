"""forge_cli/judgements.py: `forge show RUN --judgements` as a person reads it: the screenshots counted from the
image references the store keeps, the reply's last line, the score or why there is none."""

from __future__ import annotations

from rich.console import Console

from openforge.forge_cli.judgements import print_judgements
from openforge.store import Judgement, Store

SHOT = {"type": "image_url", "image_url": {"url": "forge-image:" + "ab" * 32}}


def test_each_judgement_is_a_row_with_its_screenshots_and_score(store: Store) -> None:
    run = store.create_run()
    store.add_judgement(Judgement(run_id=run.id, rollout_id="ro-passed-000", model="judge-m",
                                  prompt_json=[{"role": "user", "content": [SHOT, SHOT, {"type": "text", "text": "?"}]}],
                                  reply="It looks right.\nVERDICT: PASS", score=1.0, latency_ms=12.0))
    store.add_judgement(Judgement(run_id=run.id, rollout_id="ro-timedout-0", model="judge-m",
                                  prompt_json=[{"role": "user", "content": "text only"}], error="timeout after 60 s"))
    console = Console(record=True, width=200)
    print_judgements(console, store, run.id)
    out = console.export_text()
    passed = next(line for line in out.splitlines() if "ro-passed-00" in line)
    assert "2 screenshots" in passed and "VERDICT: PASS" in passed and "1" in passed
    failed = next(line for line in out.splitlines() if "ro-timedout-" in line)
    assert "0 screenshots" in failed and "timeout after 60 s" in failed


def test_no_judgements_is_said_so(store: Store) -> None:
    run = store.create_run()
    console = Console(record=True, width=120)
    print_judgements(console, store, run.id, rollout_id="ro-x")
    assert console.export_text().strip() == "no judgements for rollout ro-x"
