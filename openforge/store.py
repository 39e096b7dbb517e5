"""The run store: OpenForge's memory, one SQLite file a person can query with `sqlite3` (or, when one
file is not enough, a PostgreSQL database: `store.url`, docs/cluster.md).

Tables (all plain, JSON in TEXT columns where a value is a list or an object):

    run         one run: its config, kind (train / eval / proxy), status and timestamps
    task        the tasks a run uses (a copy, so a run stays readable if the task files change)
    rollout     one agent attempt at one task in one sandbox; its credential, status, reward
    call        one model call through the proxy: request/response JSON and the exact tokens
    trajectory  the token sequence(s) assembled from a rollout's calls, with loss masks
    trainstep   the metrics of one training step
    checkpoint  an adapter or full checkpoint saved by the trainer

The tables themselves are defined in `openforge.tables` (and re-exported here). Writes go through the
methods of `Store` in this module (sync, SQLModel sessions) or through
`openforge.async_store.AsyncStore` (async, its own writer thread: the proxy's batched recorder). The file is in WAL mode so the
dashboard can read while the proxy and trainer write.

Opening (engines, connection settings, errors as one line) is `openforge.db`; the schema versions are
`openforge.migrations`. The patches `RunPatch` / `RolloutPatch` name every column an update may set.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypedDict

from sqlalchemy import text
from sqlalchemy.exc import DatabaseError, IntegrityError
from sqlmodel import Session, select
from typing_extensions import Unpack

from openforge import db
from openforge.errors import NotFoundError, StoreError
from openforge.migrations import MIGRATIONS, SCHEMA_VERSION, migrate  # noqa: F401 - re-exported
from openforge.tables import (  # noqa: F401 - re-exported: callers import the tables from here
    CALL_CLIENT_LEFT,
    CALL_STATES,
    FAILURE_KINDS,
    ROLLOUT_FINAL,
    RUN_FINAL,
    Call,
    Checkpoint,
    Judgement,
    Rollout,
    Run,
    SchemaMigration,
    Task,
    TrainStep,
    Trajectory,
    JUDGE_DEADLINE_HEADER,
    JUDGE_KEY_PREFIX,
    JUDGE_ROUTE,
    JUDGEMENT_HEADER,
    hash_key,
    new_id,
    new_judge_key,
    new_rollout_key,
    utcnow,
)

LIVE_ROLLOUT = ("pending", "running")  # the states in which a rollout's key works


class RunPatch(TypedDict, total=False):
    """The columns `Store.update_run` may set."""

    name: str
    status: str
    owner_pid: int | None
    current_adapter: str | None
    policy_version: int | None
    isolation: str | None
    error: str | None
    config: dict[str, Any] | None  # -> config_json
    summary: dict[str, Any] | None  # -> summary_json
    started_at: datetime | None
    ended_at: datetime | None


class RolloutPatch(TypedDict, total=False):
    """The columns `Store.update_rollout` may set."""

    status: str
    reward: float | None
    adapter: str | None
    sandbox_id: str | None
    attempts: int
    exit_code: int | None
    stdout: str | None
    stderr: str | None
    verifier_output: str | None
    error: str | None
    failure_kind: str | None
    key_hash: str | None  # replaced by a judge key's once the agent is gone (rollouts/runner/grader.py)
    n_calls: int
    n_tokens: int
    n_segments: int
    n_extends: int
    started_at: datetime | None
    ended_at: datetime | None


def _checked(patch: dict[str, Any], kind: type) -> dict[str, Any]:
    unknown = set(patch) - set(kind.__annotations__)
    if unknown:
        raise TypeError(f"{kind.__name__} has no field(s) {', '.join(sorted(unknown))}")
    return patch


@dataclass(frozen=True)
class Recovered:
    """What `Store.recover` found left behind by processes that are gone."""

    runs: list[str]  # runs marked interrupted (their owner died)
    calls: int  # in-flight calls marked interrupted


class Store:
    """A handle on one store: an SQLite file (a path) or a PostgreSQL database (a URL, see
    `openforge.db`). Cheap to create; open one per process."""

    def __init__(self, path: str | Path) -> None:
        # `path`: the location as given, to reopen the store elsewhere (a proxy worker, the dashboard):
        # a Path for an SQLite file, the URL string for PostgreSQL. `where` is for messages.
        self.path: Any = db.location(path)
        self.postgres = db.is_url(self.path)
        self.where = db.redact(self.path)
        if not self.postgres:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create the data dir {self.path.parent}: {exc}") from None
            db.check_file(self.path)
        self.engine = db.sync_engine(self.path)
        with self.guard(), self.engine.begin() as conn:
            migrate(conn, self.path)

    # Every public function runs inside `guard()`, which turns SQLite's errors into one clear line.
    @contextmanager
    def guard(self) -> Iterator[None]:
        try:
            yield
        except IntegrityError as exc:
            raise StoreError(f"run store {self.where}: {' '.join(str(exc.orig).split())}") from None
        except (DatabaseError, sqlite3.DatabaseError, OSError) as exc:
            raise db.store_error(exc, self.path) from None

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.guard(), Session(self.engine, expire_on_commit=False) as s:
            yield s

    def schema_version(self) -> int:
        with self.guard(), self.engine.connect() as conn:
            return int(conn.exec_driver_sql("SELECT max(version) FROM schema_migrations").scalar() or 0)

    def integrity_check(self) -> str:
        """"ok", or what is wrong. SQLite: `PRAGMA integrity_check` (pages, indexes, constraints).
        PostgreSQL (which has no such pragma; its pages carry their own checks): every index of the
        store valid and ready (a crashed `CREATE INDEX CONCURRENTLY` leaves one that is not), the
        B-tree indexes checked against their tables with `amcheck` where the extension is installed,
        and no call numbered twice within a rollout."""
        with self.guard(), self.engine.connect() as conn:
            if not self.postgres:
                return str(conn.exec_driver_sql("PRAGMA integrity_check").scalar())
            problems = [f"index {name} is not valid" for (name,) in conn.exec_driver_sql(
                "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = current_schema() "
                "AND NOT (i.indisvalid AND i.indisready)")]
            if conn.exec_driver_sql("SELECT 1 FROM pg_extension WHERE extname = 'amcheck'").first():
                for (name,) in conn.exec_driver_sql(
                        "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                        "JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_am a ON a.oid = c.relam "
                        "WHERE n.nspname = current_schema() AND a.amname = 'btree'"):
                    try:
                        conn.exec_driver_sql(f"SELECT bt_index_check('{name}'::regclass, true)")
                    except DatabaseError as exc:
                        problems.append(f"index {name}: {' '.join(str(exc.orig).split())[:200]}")
                        conn.rollback()
            dup = conn.exec_driver_sql("SELECT count(*) FROM (SELECT 1 FROM call GROUP BY rollout_id, seq "
                                       "HAVING count(*) > 1) AS d").scalar()
            if dup:
                problems.append(f"{dup} call numbers given twice within a rollout")
            return "; ".join(problems) or "ok"

    def close(self) -> None:
        self.engine.dispose()

    # ------------------------------------------------------------------------------------------
    # Runs

    def create_run(self, *, kind: str = "train", name: str = "", config: dict[str, Any] | None = None,
                   run_id: str | None = None, owner_pid: int | None = None) -> Run:
        run = Run(id=run_id or new_id("run"), kind=kind, name=name, owner_pid=owner_pid,
                  config_json=config)
        with self.session() as s:
            s.add(run)
            s.commit()
        return run

    def get_run(self, run_id: str) -> Run:
        """A run by its id, or by a unique prefix of it; `latest` is the newest run."""
        if not run_id.strip():  # a prefix of every id: never "ambiguous", never the only run
            raise NotFoundError("an empty run id names no run: give a run id, a unique prefix of one, or 'latest'")
        with self.session() as s:
            if run_id == "latest":
                run = s.exec(select(Run).order_by(Run.created_at.desc())).first()  # type: ignore[attr-defined]
            else:
                run = s.get(Run, run_id)
                if run is None:
                    matches = s.exec(select(Run).where(Run.id.startswith(run_id))).all()  # type: ignore[attr-defined]
                    if len(matches) > 1:
                        raise NotFoundError(f"run id {run_id!r} is ambiguous: {', '.join(m.id for m in matches[:5])}")
                    run = matches[0] if matches else None
        if run is None:
            raise NotFoundError(f"no run {run_id!r} in {self.path} (see `forge runs`)")
        return run

    def list_runs(self, *, limit: int = 50) -> list[Run]:
        with self.session() as s:
            return list(s.exec(select(Run).order_by(Run.created_at.desc()).limit(limit)).all())  # type: ignore[attr-defined]

    def update_run(self, run_id: str, **patch: Unpack[RunPatch]) -> Run:
        fields = _checked(dict(patch), RunPatch)
        with self.session() as s:
            run = s.get(Run, run_id)
            if run is None:
                raise NotFoundError(f"no run {run_id!r}")
            for key, value in fields.items():
                setattr(run, f"{key}_json" if key in ("config", "summary") else key, value)
            s.add(run)
            s.commit()
            return run

    def set_run_status(self, run_id: str, status: str, *, error: str | None = None) -> Run:
        fields: RunPatch = {"status": status}
        now = utcnow()
        if status == "running":
            fields["started_at"] = now
        if status in RUN_FINAL:
            fields["ended_at"] = now
        if error is not None:
            fields["error"] = error
        run = self.update_run(run_id, **fields)
        if status in RUN_FINAL:
            self.settle_calls(run_id, why=f"the run ended ({status}) before the call's end was recorded")
        return run

    def settle_calls(self, run_id: str, *, why: str) -> int:
        """A run that has ended has no call in flight: its rows still `in_flight` (their end was never
        recorded: a full disk refused the write, the process died) become `interrupted`. Returns how many."""
        with self.session() as s:
            n = s.connection().execute(
                text("UPDATE call SET status='interrupted', ended_at=:now, error=:why "
                     "WHERE run_id=:r AND status='in_flight'"), {"r": run_id, "now": utcnow(), "why": why}).rowcount
            s.commit()
        return n

    def mark_interrupted(self, *, alive: Callable[[int], bool]) -> list[str]:
        """Runs left `running`/`paused` by a process that no longer lives become `interrupted`,
        with their unfinished rollouts and in-flight calls. Returns the runs marked."""
        marked: list[str] = []
        with self.session() as s:
            runs = s.exec(select(Run).where(Run.status.in_(("running", "paused", "created")))).all()  # type: ignore[attr-defined]
            for run in runs:
                # Without an owner pid nobody can tell whether the run is still driven: leave it.
                if run.owner_pid is None or alive(run.owner_pid):
                    continue
                run.status, run.ended_at = "interrupted", utcnow()
                s.add(run)
                marked.append(run.id)
            s.commit()
        for run_id in marked:
            self.interrupt_unfinished(run_id)
        return marked

    def interrupt_unfinished(self, run_id: str) -> tuple[int, int]:
        """Mark a run's unfinished rollouts and in-flight calls interrupted. Returns their counts."""
        with self.session() as s:
            n_roll = s.connection().execute(
                text("UPDATE rollout SET status='interrupted', ended_at=:now "
                     "WHERE run_id=:r AND status IN ('pending','running')"),
                {"r": run_id, "now": utcnow()},
            ).rowcount
            n_call = s.connection().execute(
                text("UPDATE call SET status='interrupted', ended_at=:now WHERE run_id=:r AND status='in_flight'"),
                {"r": run_id, "now": utcnow()},
            ).rowcount
            s.commit()
        return n_roll, n_call

    def recover(self, *, alive: Callable[[int], bool], this_pid: int | None = None) -> Recovered:
        """What a starting proxy cleans up: runs whose owner died become interrupted (with their
        rollouts, whose keys then stop working, and calls); calls left in flight of a run with no
        owner, or owned by this very process (a proxy starting now has served nothing yet), too."""
        this_pid = os.getpid() if this_pid is None else this_pid
        with self.session() as s:
            conn = s.connection()
            rows = conn.execute(text(
                "SELECT DISTINCT call.run_id, run.owner_pid, run.status FROM call LEFT JOIN run ON run.id = call.run_id "
                "WHERE call.status = 'in_flight'")).all()
            # an ended run serves nothing, whoever its recorded pid is now (pids are reused)
            stale = [run_id for run_id, pid, status in rows
                     if pid is None or pid == this_pid or status in RUN_FINAL or not alive(pid)]
            n = 0
            for run_id in stale:
                n += conn.execute(text(
                    "UPDATE call SET status='interrupted', ended_at=:now, error='the proxy stopped mid-call' "
                    "WHERE run_id=:r AND status='in_flight'"), {"r": run_id, "now": utcnow()}).rowcount
            s.commit()
        return Recovered(runs=self.mark_interrupted(alive=alive), calls=n)

    # ------------------------------------------------------------------------------------------
    # Tasks

    def add_tasks(self, run_id: str, tasks: Sequence[dict[str, Any]]) -> None:
        """Copy task specs (dicts with at least `id` and `instruction`) into the run; re-adding is a no-op."""
        with self.session() as s:
            have = set(s.exec(select(Task.task_id).where(Task.run_id == run_id)).all())
            for spec in tasks:
                if spec["id"] in have:
                    continue
                s.add(Task(run_id=run_id, task_id=spec["id"], instruction=spec.get("instruction", ""),
                           spec_json=dict(spec)))
            s.commit()

    def list_tasks(self, run_id: str) -> list[Task]:
        with self.session() as s:
            return list(s.exec(select(Task).where(Task.run_id == run_id).order_by(Task.id)).all())

    # ------------------------------------------------------------------------------------------
    # Rollouts

    def create_rollout(self, *, run_id: str, task_id: str, step: int = 0, sample_index: int = 0,
                       sandbox: str = "", harness: str = "", adapter: str | None = None,
                       key: str | None = None, status: str = "pending") -> Rollout:
        """A new rollout whose credential is `key` (a fresh `new_rollout_key()` when None). Only the
        key's hash is stored; the plain key is on the returned object (`rollout.key`) alone.

        It records its run's `policy_version` when `adapter` is the run's current one. The trainer
        sets both at once after the engine serves the new weights, so under full fine-tuning (weights
        replaced in place) no token of the rollout comes from an older version than it records; a
        rollout created for an older adapter than the run's records none (its adapter names it)."""
        key = key or new_rollout_key()
        rollout = Rollout(id=new_id("ro"), run_id=run_id, task_id=task_id, step=step,
                          sample_index=sample_index, sandbox=sandbox, harness=harness, adapter=adapter,
                          key_hash=hash_key(key), status=status)
        with self.session() as s:
            run = s.get(Run, run_id)
            if run is not None and run.current_adapter == adapter:
                rollout.policy_version = run.policy_version
            s.add(rollout)
            s.commit()
        rollout._key = key
        return rollout

    def get_rollout(self, rollout_id: str) -> Rollout:
        with self.session() as s:
            rollout = s.get(Rollout, rollout_id)
        if rollout is None:
            raise NotFoundError(f"no rollout {rollout_id!r}")
        return rollout

    def rollout_by_key(self, key: str) -> Rollout | None:
        """The live rollout a plain credential belongs to (looked up by its hash), or None: a key
        works only while its rollout is pending/running and its run has not ended."""
        with self.session() as s:
            return s.exec(select(Rollout).join(Run, Run.id == Rollout.run_id).where(  # type: ignore[arg-type]
                Rollout.key_hash == hash_key(key), Rollout.status.in_(LIVE_ROLLOUT),  # type: ignore[attr-defined]
                Run.status.not_in(RUN_FINAL))).first()  # type: ignore[attr-defined]

    def key_in_use(self, key: str) -> bool:
        """Whether any rollout, live or ended, was given this credential (keys are unique)."""
        return self.rollout_with_key(key) is not None

    def rollout_with_key(self, key: str) -> Rollout | None:
        """The rollout, live or ended, that holds this credential (keys are unique), or None."""
        with self.session() as s:
            return s.exec(select(Rollout).where(Rollout.key_hash == hash_key(key))).first()

    def update_rollout(self, rollout_id: str, **patch: Unpack[RolloutPatch]) -> Rollout:
        fields = _checked(dict(patch), RolloutPatch)
        with self.session() as s:
            rollout = s.get(Rollout, rollout_id)
            if rollout is None:
                raise NotFoundError(f"no rollout {rollout_id!r}")
            if fields.get("status") == "running" and rollout.started_at is None:
                fields.setdefault("started_at", utcnow())
            if fields.get("status") in ROLLOUT_FINAL:
                fields.setdefault("ended_at", utcnow())
            for key, value in fields.items():
                setattr(rollout, key, value)
            s.add(rollout)
            s.commit()
            return rollout

    def move_live_rollouts(self, run_id: str, adapter: str | None, *, max_adapters: int,
                           past_cap: bool) -> tuple[int, int]:
        """Partial rollouts (`trainer.rollout_versions`): the run's pending and running rollouts are
        served with `adapter` from their next call on (the proxy reads `Rollout.adapter` per call; each
        call records the adapter that served it). A rollout whose calls and current adapter already
        span `max_adapters` adapters is at the cap: it keeps its adapter unless `past_cap`.
        Returns (moved, kept at the cap)."""
        moved = capped = 0
        with self.session() as s:
            conn = s.connection()
            live = conn.execute(text("SELECT id, adapter FROM rollout WHERE run_id=:r AND status IN ('pending','running')"),
                                {"r": run_id}).all()
            spans: dict[str, set[str | None]] = {rid: {current} for rid, current in live}
            for rid, served in conn.execute(text(
                    "SELECT DISTINCT call.rollout_id, call.adapter FROM call JOIN rollout ON rollout.id = call.rollout_id "
                    "WHERE rollout.run_id=:r AND rollout.status IN ('pending','running')"), {"r": run_id}).all():
                if rid in spans:
                    spans[rid].add(served)
            for rid, current in live:
                if current == adapter:
                    continue
                if len(spans[rid]) >= max_adapters and not past_cap:
                    capped += 1
                    continue
                # only while it is live: a rollout that ended meanwhile keeps the adapter it ended with
                moved += conn.execute(text("UPDATE rollout SET adapter=:a WHERE id=:i AND status IN ('pending','running')"),
                                      {"a": adapter, "i": rid}).rowcount
            s.commit()
        return moved, capped

    def list_rollouts(self, run_id: str, *, step: int | None = None, status: str | None = None,
                      limit: int | None = None, newest_first: bool = False) -> list[Rollout]:
        with self.session() as s:
            q = select(Rollout).where(Rollout.run_id == run_id)
            if step is not None:
                q = q.where(Rollout.step == step)
            if status is not None:
                q = q.where(Rollout.status == status)
            order = Rollout.created_at.desc() if newest_first else Rollout.created_at  # type: ignore[attr-defined]
            q = q.order_by(order)
            if limit is not None:
                q = q.limit(limit)
            return list(s.exec(q).all())

    # ------------------------------------------------------------------------------------------
    # Calls (the proxy writes these through AsyncStore; the sync path serves tests and tools)

    def list_calls(self, *, run_id: str | None = None, rollout_id: str | None = None,
                   limit: int | None = None, newest_first: bool = False) -> list[Call]:
        with self.session() as s:
            q = select(Call)
            if run_id is not None:
                q = q.where(Call.run_id == run_id)
            if rollout_id is not None:
                q = q.where(Call.rollout_id == rollout_id)
            q = q.order_by(Call.id.desc() if newest_first else Call.id)  # type: ignore[union-attr]
            if limit is not None:
                q = q.limit(limit)
            return list(s.exec(q).all())

    def call_spans(self, *, rollout_id: str, after_id: int = 0) -> list[tuple[datetime, datetime | None]]:
        """(started_at, ended_at) of a rollout's calls with id > `after_id`, in order; ended_at None while
        in flight. Two columns only: the runner reads them every few seconds of a rollout's run."""
        with self.session() as s:
            q = (select(Call.started_at, Call.ended_at)
                 .where(Call.rollout_id == rollout_id, Call.id > after_id)  # type: ignore[operator]
                 .order_by(Call.id))  # type: ignore[arg-type]
            return [(start, end) for start, end in s.exec(q).all()]

    def get_call(self, call_id: int) -> Call:
        with self.session() as s:
            call = s.get(Call, call_id)
        if call is None:
            raise NotFoundError(f"no call {call_id}")
        return call

    def add_call(self, call: Call) -> Call:
        with self.session() as s:
            s.add(call)
            s.commit()
            return call

    # ------------------------------------------------------------------------------------------
    # Judgements (one per judge call: the runner writes it, or the proxy's judge route and the
    # runner then adds the parsed score)

    def add_judgement(self, judgement: Judgement) -> Judgement:
        with self.session() as s:
            s.add(judgement)
            s.commit()
            return judgement

    def score_judgement(self, judgement_id: int, *, score: float | None, error: str | None) -> None:
        """The parsed score of a judgement the proxy recorded, or why there is none (a proxy's error stays)."""
        with self.session() as s:
            row = s.get(Judgement, judgement_id)
            if row is None:
                raise NotFoundError(f"no judgement {judgement_id}")
            row.score, row.error = score, row.error or error
            s.add(row)
            s.commit()

    def list_judgements(self, *, run_id: str | None = None, rollout_id: str | None = None) -> list[Judgement]:
        with self.session() as s:
            q = select(Judgement)
            if run_id is not None:
                q = q.where(Judgement.run_id == run_id)
            if rollout_id is not None:
                q = q.where(Judgement.rollout_id == rollout_id)
            return list(s.exec(q.order_by(Judgement.id)).all())  # type: ignore[arg-type]

    def tag_side_calls(self, names: dict[int, str]) -> None:
        """Mark calls (id -> name) as a harness's own background calls (`call.side`)."""
        if not names:
            return
        with self.session() as s:
            s.connection().execute(text("UPDATE call SET side=:n WHERE id=:i"),
                                   [{"i": i, "n": n} for i, n in names.items()])
            s.commit()

    # ------------------------------------------------------------------------------------------
    # Trajectories

    def replace_trajectories(self, rollout_id: str, rows: Sequence[Trajectory]) -> None:
        """Store a rollout's assembled segments, replacing any earlier assembly."""
        with self.session() as s:
            s.connection().execute(text("DELETE FROM trajectory WHERE rollout_id=:r"), {"r": rollout_id})
            for row in rows:
                s.add(row)
            s.commit()

    def list_trajectories(self, *, run_id: str | None = None, rollout_ids: Sequence[str] | None = None
                          ) -> list[Trajectory]:
        with self.session() as s:
            q = select(Trajectory)
            if run_id is not None:
                q = q.where(Trajectory.run_id == run_id)
            if rollout_ids is not None:
                q = q.where(Trajectory.rollout_id.in_(list(rollout_ids)))  # type: ignore[attr-defined]
            return list(s.exec(q.order_by(Trajectory.rollout_id, Trajectory.segment)).all())

    # ------------------------------------------------------------------------------------------
    # Training

    def add_train_step(self, step: TrainStep) -> TrainStep:
        with self.session() as s:
            s.add(step)
            s.commit()
            return step

    def list_train_steps(self, run_id: str) -> list[TrainStep]:
        with self.session() as s:
            return list(s.exec(select(TrainStep).where(TrainStep.run_id == run_id).order_by(TrainStep.step)).all())

    def drop_train_steps_after(self, run_id: str, step: int) -> int:
        """Delete the run's train_step rows past `step` (a resumed run redoes the steps its last
        checkpoint does not hold); returns how many."""
        with self.session() as s:
            rows = list(s.exec(select(TrainStep).where(TrainStep.run_id == run_id, TrainStep.step > step)).all())
            for row in rows:
                s.delete(row)
            s.commit()
            return len(rows)

    def add_checkpoint(self, checkpoint: Checkpoint) -> Checkpoint:
        with self.session() as s:
            s.add(checkpoint)
            s.commit()
            return checkpoint

    def list_checkpoints(self, run_id: str) -> list[Checkpoint]:
        with self.session() as s:
            return list(s.exec(select(Checkpoint).where(Checkpoint.run_id == run_id).order_by(Checkpoint.step)).all())

    def latest_checkpoint(self, run_id: str) -> Checkpoint | None:
        with self.session() as s:
            return s.exec(
                select(Checkpoint).where(Checkpoint.run_id == run_id).order_by(Checkpoint.step.desc())  # type: ignore[attr-defined]
            ).first()


STORE_URL_ENV = "FORGE_STORE_URL"


def open_store(home: Path, url: str = "") -> Store:
    """The store of `home`: the PostgreSQL database `url` (or `$FORGE_STORE_URL`) names, else the
    SQLite file `home/forge.db`."""
    from openforge.paths import db_path

    return Store(url or os.environ.get(STORE_URL_ENV) or db_path(home))
