"""Pilot tests of the dashboard's asynchronous panel: versions in flight, staleness histogram, buffer depth,
from what a real asynchronous train loop recorded in the store (trainer.max_staleness > 0)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from textual.widgets import Static

from openforge.forge_cli.dashboard import make_dashboard
from openforge.store import Store, TrainStep
from openforge.trainer.checkpoint import adapter_name
from openforge.trainer.loop import train
from tests.helpers.trainer import _cfg, ReplaySampler, TASKS, TimedSampler
from tests.helpers.cli import plain, wait_for


async def test_an_async_run_shows_versions_in_flight_staleness_and_buffer_depth(
        store: Store, tiny_model: Path, forge_home: Path) -> None:
    cfg = _cfg(steps=3, max_staleness=1)
    run = store.create_run(name="async", config={"trainer": cfg.model_dump(), "engine": {"kind": "embedded"}})
    train(store, run.id, cfg, model_path=tiny_model, tasks=TASKS, sampler=TimedSampler(store), home=forge_home)
    assert store.get_run(run.id).current_adapter == adapter_name(run.id, 2)  # version 3 is served now
    # groups still running under the newest two versions, as they would be mid-run
    for step, n in ((1, 1), (2, 2)):
        for _ in range(n):
            store.create_rollout(run_id=run.id, task_id=TASKS[0]["id"], step=3, adapter=adapter_name(run.id, step),
                                 status="running")
    recorded = Counter()
    for s in store.list_train_steps(run.id):
        recorded.update({int(b): n for b, n in s.metrics_json["staleness"].items()})
    last_depth = store.list_train_steps(run.id)[-1].metrics_json["buffer_depth"]

    app = make_dashboard(store.path, run.id)
    async with app.run_test(size=(200, 60)) as pilot:
        box = app.query_one("#async", Static)
        await wait_for(pilot, lambda: box.display)
        text = " ".join(plain(box.content).split())
        assert "in flight v2: 1 v3: 2 (now)" in text, text
        assert "v3: 2 (now) bound 1" in text
        for behind, n in recorded.items():  # one bar per versions-behind, with the groups the loop recorded
            assert f"{behind} behind" in text and f"{n} groups" in text, (behind, n, text)
        assert set(recorded) == {0, 1}  # K = 1: some groups trained one version late, none later
        assert f"buffer {last_depth} groups waiting · bound waits" in text, text


async def test_a_synchronous_run_has_no_async_panel(store: Store, tiny_model: Path, forge_home: Path) -> None:
    cfg = _cfg(steps=1)
    run = store.create_run(name="sync", config={"trainer": cfg.model_dump()})
    train(store, run.id, cfg, model_path=tiny_model, tasks=TASKS, sampler=ReplaySampler(store), home=forge_home)
    app = make_dashboard(store.path, run.id)
    async with app.run_test(size=(200, 60)) as pilot:
        await pilot.pause()
        assert not app.query_one("#async", Static).display


async def test_token_staleness_and_partial_rollouts_are_shown(store: Store) -> None:
    """What a run with partial rollouts (trainer.rollout_versions > 1) records per step."""
    run = store.create_run(name="partial", config={"trainer": {"max_staleness": 2, "rollout_versions": 2}})
    store.add_train_step(TrainStep(run_id=run.id, step=0, metrics_json={
        "staleness": {"0": 2, "2": 1}, "buffer_depth": 1, "versions_in_flight": {}, "stale_waits": 0,
        "failed_groups": 0, "rollouts_moved": 3, "version_capped": 1, "token_staleness": {"0": 40, "1": 10},
        "spanning_rollouts": 2, "version_dropped_groups": 0}))
    app = make_dashboard(store.path, run.id)
    async with app.run_test(size=(200, 60)) as pilot:
        box = app.query_one("#async", Static)
        await wait_for(pilot, lambda: box.display)
        text = " ".join(plain(box.content).split())
        assert "in flight none" in text and "2 behind" in text and "1 groups" in text
        assert "tokens behind 0: 40 1: 10" in text
        assert "moved 3 · held at the cap 1 · groups dropped at the cap 0 · trained rollouts spanning versions 2" in text
