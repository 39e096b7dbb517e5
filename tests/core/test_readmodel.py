"""openforge/readmodel.py: what the dashboard, `forge runs` and `forge show` read of a run, counted in SQL."""

from __future__ import annotations

from pathlib import Path

from openforge.readmodel import list_run_rows, read_judgements, read_run_report, read_snapshot, run_log_path
from openforge.store import Call, Judgement, Store, TrainStep


def _run(store: Store) -> str:
    """A run with rollouts in every state the report tells apart."""
    run = store.create_run(config={"harness": {"name": "mini"}})
    ends = [("scored", 1.0, None, "mini"), ("scored", 0.0, "policy", "mini"), ("timed_out", 0.0, "timeout", "codex"),
            ("failed", None, "infra", "codex"), ("running", None, None, "mini"), ("pending", None, None, "mini")]
    for i, (status, reward, kind, harness) in enumerate(ends):
        ro = store.create_rollout(run_id=run.id, task_id=f"t{i}", sample_index=i, harness=harness)
        store.update_rollout(ro.id, status=status, reward=reward, failure_kind=kind,
                             error="sandbox gone" if status == "failed" else None)
        if i < 3:
            store.add_call(Call(run_id=run.id, rollout_id=ro.id, seq=0, status="ok"))
    store.add_train_step(TrainStep(run_id=run.id, step=0, loss=0.5))
    store.add_judgement(Judgement(run_id=run.id, rollout_id=ro.id, score=1.0))
    store.add_judgement(Judgement(run_id=run.id, rollout_id=ro.id, error="timeout"))
    return run.id


def test_the_report_averages_the_policys_samples_and_leaves_infra_failures_out(store: Store) -> None:
    report = read_run_report(store, _run(store))
    assert report.counts == {"scored": 2, "timed_out": 1, "failed": 1, "running": 1, "pending": 1}
    assert report.n_rollouts == 6
    assert (report.n_samples, report.mean_reward) == (3, 1 / 3)  # scored + timed out; the infra failure is no 0
    assert (report.n_scored, report.mean_scored_reward) == (2, 0.5)
    assert report.by_harness == {"mini": (2, 0.5), "codex": (1, 0.0)}
    assert sorted((r.status, r.failure_kind) for r in report.failed) == [
        ("failed", "infra"), ("scored", "policy"), ("timed_out", "timeout")]
    assert report.judgements == (2, 1) and [s.step for s in report.steps] == [0]


def test_the_snapshot_lists_live_rollouts_first_and_counts_the_whole_run(store: Store) -> None:
    run_id = _run(store)
    snap = read_snapshot(store, run_id, max_rollouts=3, max_calls=2)
    assert [r.status for r in snap.rollouts[:2]] == ["running", "pending"]
    assert len(snap.rollouts) == 3 and len(snap.calls) == 2 and snap.n_calls == 3  # bounded lists, whole counts
    assert sum(snap.counts.values()) == 6 and snap.live_by_adapter == {None: 2}
    assert snap.config == {"harness": {"name": "mini"}} and snap.judgements == (2, 1)


def test_runs_are_listed_newest_first_with_their_counts(store: Store) -> None:
    first = _run(store)
    second = store.create_run().id
    rows = list_run_rows(store, limit=5)
    assert [(r.run.id, r.n_rollouts, r.n_steps) for r in rows] == [(second, 0, 0), (first, 6, 1)]
    assert [r.run.id for r in list_run_rows(store, limit=1)] == [second]


def test_judgements_are_read_oldest_first_and_the_log_sits_in_the_runs_folder(store: Store, forge_home: Path) -> None:
    run_id = _run(store)
    assert [j.error for j in read_judgements(store, run_id)] == [None, "timeout"]
    assert [j.error for j in read_judgements(store, run_id, limit=1)] == ["timeout"]  # the newest
    assert run_log_path(store.path, run_id) == Path(store.path).parent / "runs" / run_id / "forge.log"
    assert run_log_path("postgresql://db/forge", "r1") == forge_home / "runs" / "r1" / "forge.log"
