"""The dashboard's read model: what `forge up` / `forge dash` show of one run, read from the store in one go.

It lives beside the store (not in the CLI) so that the dashboard, benchmarks and other tools read a
run the same way: `read_snapshot` is a handful of small queries, each bounded by a limit, so polling
it every second stays cheap however long the run is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, literal_column
from sqlalchemy.orm import load_only
from sqlmodel import select

from openforge.db import is_url
from openforge.store import Call, Judgement, Rollout, Run, Store, TrainStep, utcnow


@dataclass
class Snapshot:
    run: Run
    config: dict[str, Any]
    steps: list[TrainStep]
    rollouts: list[Rollout]  # in flight first, then the most recently created
    calls: list[Call]  # newest first
    counts: dict[str, int] = field(default_factory=dict)  # rollouts of the whole run by status
    n_calls: int = 0
    now: datetime = field(default_factory=utcnow)
    judgements: tuple[int, int] = (0, 0)  # judge calls of the run: (all, failed)
    live_by_adapter: dict[str | None, int] = field(default_factory=dict)  # pending + running rollouts by adapter


# Only the columns on screen: a rollout's stdout/stderr (up to 64 KB each) and a call's request and
# response (the whole conversation) stay in the file; a call is read in full when it is opened.
_ROLLOUT_COLS = (Rollout.id, Rollout.run_id, Rollout.task_id, Rollout.step, Rollout.status, Rollout.reward,
                 Rollout.n_calls, Rollout.n_tokens, Rollout.created_at, Rollout.started_at, Rollout.ended_at)
# Newest by rowid, not created_at: SQLite reads a column stored after a large one (stdout) by walking
# its overflow pages, so sorting 2,000 rollouts by created_at costs ~80 ms where rowid (insertion
# order, which is creation order) costs ~0.05 ms.
_ROWID = literal_column("rollout.rowid")
_CALL_COLS = (Call.id, Call.run_id, Call.rollout_id, Call.api, Call.status, Call.prompt_tokens,
              Call.completion_tokens, Call.latency_ms, Call.finish_reason)


def read_snapshot(store: Store, run_id: str, *, max_rollouts: int = 40, max_calls: int = 30) -> Snapshot:
    run = store.get_run(run_id)
    newest = Rollout.created_at if store.postgres else _ROWID  # PostgreSQL has no rowid (nor the overflow walk)
    with store.session() as s:
        counts = dict(s.exec(
            select(Rollout.status, func.count()).where(Rollout.run_id == run.id).group_by(Rollout.status)
        ).all())
        n_calls = s.exec(select(func.count()).select_from(Call).where(Call.run_id == run.id)).one()
        judged, judge_failed = s.exec(select(func.count(), func.count(Judgement.error))
                                      .where(Judgement.run_id == run.id)).one()
        is_live = Rollout.status.in_(("pending", "running"))  # type: ignore[attr-defined]
        live_by_adapter = dict(s.exec(
            select(Rollout.adapter, func.count()).where(Rollout.run_id == run.id, is_live).group_by(Rollout.adapter)
        ).all())
        rollouts = select(Rollout).options(load_only(*_ROLLOUT_COLS)).where(Rollout.run_id == run.id)
        live = list(s.exec(
            rollouts.where(is_live)
            .order_by(newest).limit(max_rollouts)
        ).all())
        recent = list(s.exec(rollouts.order_by(newest.desc()).limit(max_rollouts)).all())  # type: ignore[attr-defined]
        calls = list(s.exec(
            select(Call).options(load_only(*_CALL_COLS)).where(Call.run_id == run.id)
            .order_by(Call.id.desc()).limit(max_calls)  # type: ignore[union-attr]
        ).all())
    seen = {r.id for r in live}
    return Snapshot(
        run=run, config=run.config_json or {}, steps=store.list_train_steps(run.id),
        rollouts=(live + [r for r in recent if r.id not in seen])[:max_rollouts], calls=calls,
        counts=counts, n_calls=int(n_calls), judgements=(int(judged), int(judge_failed)),
        live_by_adapter={a: int(n) for a, n in live_by_adapter.items()},
    )


def run_log_path(store_path: str | Path, run_id: str) -> Path:
    """The run's log file: `forge up` writes it, the dashboard tails it (`<home>/runs/<id>/forge.log`).
    A PostgreSQL store has no folder of its own: the log is under FORGE_HOME then."""
    if is_url(store_path):
        from openforge.paths import forge_home

        return forge_home() / "runs" / run_id / "forge.log"
    return Path(store_path).parent / "runs" / run_id / "forge.log"


@dataclass(frozen=True)
class RunListRow:
    """One line of `forge runs`: the run and how much it holds, counted in SQL (no rollout is read)."""

    run: Run
    n_rollouts: int
    n_steps: int


def list_run_rows(store: Store, *, limit: int) -> list[RunListRow]:
    """The newest `limit` runs with their rollout and train step counts: three queries, however big the runs."""
    runs = store.list_runs(limit=limit)
    ids = [r.id for r in runs]
    with store.session() as s:
        rollouts = dict(s.exec(select(Rollout.run_id, func.count()).where(Rollout.run_id.in_(ids))  # type: ignore[attr-defined]
                               .group_by(Rollout.run_id)).all())
        steps = dict(s.exec(select(TrainStep.run_id, func.count()).where(TrainStep.run_id.in_(ids))  # type: ignore[attr-defined]
                            .group_by(TrainStep.run_id)).all())
    return [RunListRow(run=r, n_rollouts=int(rollouts.get(r.id, 0)), n_steps=int(steps.get(r.id, 0))) for r in runs]


@dataclass(frozen=True)
class RunReport:
    """What `forge show` and the end of `forge up` / `forge train` print of one run."""

    run: Run
    counts: dict[str, int]  # rollouts by status
    mean_reward: float | None  # over the policy's samples: scored or timed out (infra failures left out)
    n_samples: int  # those samples
    n_scored: int  # rollouts `scored` with a reward
    mean_scored_reward: float | None
    failed: list[Rollout]  # failed, timed out or the policy's failure: status, failure_kind, error loaded
    steps: list[TrainStep]
    by_harness: dict[str, tuple[int, float | None]] = field(default_factory=dict)  # harness -> (samples, mean reward)
    judgements: tuple[int, int] = (0, 0)  # judge calls of the run's tasks' judge components: (all, failed)

    @property
    def n_rollouts(self) -> int:
        return sum(self.counts.values())


def read_run_report(store: Store, run_id: str) -> RunReport:
    """Run `run_id`'s report: counts and means in SQL; only the failed rollouts' errors are read."""
    run = store.get_run(run_id)
    of_run = Rollout.run_id == run.id
    rewarded = Rollout.reward.is_not(None)  # type: ignore[union-attr]
    with store.session() as s:
        counts = dict(s.exec(select(Rollout.status, func.count()).where(of_run).group_by(Rollout.status)).all())
        samples = Rollout.status.in_(("scored", "timed_out"))  # type: ignore[attr-defined]
        n_samples, mean = s.exec(select(func.count(), func.avg(Rollout.reward)).where(of_run, rewarded, samples)).one()
        n_scored, mean_scored = s.exec(select(func.count(), func.avg(Rollout.reward))
                                       .where(of_run, rewarded, Rollout.status == "scored")).one()
        by_harness = {h or "?": (int(n), None if m is None else float(m)) for h, n, m in s.exec(
            select(Rollout.harness, func.count(), func.avg(Rollout.reward)).where(of_run, rewarded, samples)
            .group_by(Rollout.harness)).all()}
        n_judged, n_judge_failed = s.exec(select(func.count(), func.count(Judgement.error))
                                          .where(Judgement.run_id == run.id)).one()
        failed = list(s.exec(
            select(Rollout).options(load_only(Rollout.id, Rollout.status, Rollout.failure_kind, Rollout.error))
            .where(of_run, Rollout.failure_kind.is_not(None) | Rollout.status.in_(("failed", "timed_out")))  # type: ignore[union-attr,attr-defined]
        ).all())
    return RunReport(run=run, counts={k: int(v) for k, v in counts.items()},
                     mean_reward=None if mean is None else float(mean), n_samples=int(n_samples),
                     n_scored=int(n_scored),
                     mean_scored_reward=None if mean_scored is None else float(mean_scored), failed=failed,
                     steps=store.list_train_steps(run.id), by_harness=by_harness,
                     judgements=(int(n_judged), int(n_judge_failed)))


def read_judgements(store: Store, run_id: str, *, rollout_id: str | None = None, limit: int = 50) -> list[Judgement]:
    """The run's newest judge calls (or one rollout's), oldest first: what `forge show --judgements` prints."""
    with store.session() as s:
        q = select(Judgement).where(Judgement.run_id == run_id)
        if rollout_id is not None:
            q = q.where(Judgement.rollout_id == rollout_id)
        rows = list(s.exec(q.order_by(Judgement.id.desc()).limit(limit)).all())  # type: ignore[union-attr]
    return rows[::-1]
