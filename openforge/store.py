"""The run store: OpenForge's memory, one SQLite file a person can query with `sqlite3`.

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
`AsyncStore` (async, aiosqlite: the proxy's batched recorder). The file is in WAL mode so the
dashboard can read while the proxy and trainer write.

Migrations: a small numbered list (`MIGRATIONS`), applied in order and remembered in the
`schema_migrations` table, in the spirit of simonw/llm. A fresh database is created from the
models and stamped with the newest version (what Alembic calls `create_all` + `stamp head`); an
older database runs only the migrations it lacks. We chose this over Alembic because the schema is
small, every change is an `ALTER TABLE ... ADD COLUMN` or a new table, and users must be able to open
any old store without an Alembic environment next to it.
"""

from __future__ import annotations

import hashlib
import secrets
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DatabaseError, IntegrityError
from sqlmodel import Session, SQLModel, create_engine, select

from openforge.errors import NotFoundError, StoreError
from openforge.tables import (  # noqa: F401 - re-exported: callers import the tables from here
    CALL_STATES,
    FAILURE_KINDS,
    ROLLOUT_FINAL,
    RUN_FINAL,
    Call,
    Checkpoint,
    Rollout,
    Run,
    SchemaMigration,
    Task,
    TrainStep,
    Trajectory,
    new_id,
    utcnow,
)

SCHEMA_VERSION = 3


def new_rollout_key() -> str:
    """A fresh rollout credential (192 random bits). Only its `hash_key` is ever stored."""
    return f"forge-{secrets.token_urlsafe(24)}"


def hash_key(key: str) -> str:
    """What the store keeps of a credential: sha256 hex. Keys are random, so no salt or slow hash
    is needed: a hash cannot be turned back into a key that works."""
    return hashlib.sha256(key.encode()).hexdigest()


def _v3_hashed_keys_and_sampling(conn: Any) -> None:
    """Schema 3: hash the rollout keys and drop the plain ones; sampling params and failure kinds;
    unique (rollout_id, seq)."""
    sql = conn.exec_driver_sql
    # The plain keys must not survive in freed pages of the file either.
    sql("PRAGMA secure_delete=ON")
    sql("ALTER TABLE rollout ADD COLUMN key_hash VARCHAR")
    keys = sql("SELECT id, api_key FROM rollout").all()
    if keys:
        sql("UPDATE rollout SET key_hash=? WHERE id=?", [(hash_key(key), rid) for rid, key in keys])
    sql("DROP INDEX IF EXISTS ix_rollout_api_key")  # DROP COLUMN refuses an indexed column
    sql("ALTER TABLE rollout DROP COLUMN api_key")
    sql("CREATE UNIQUE INDEX ix_rollout_key_hash ON rollout (key_hash)")
    sql("ALTER TABLE rollout ADD COLUMN failure_kind VARCHAR")
    for column, kind in (("temperature", "FLOAT"), ("top_p", "FLOAT"), ("top_k", "INTEGER"),
                         ("break_reason", "VARCHAR")):
        sql(f"ALTER TABLE call ADD COLUMN {column} {kind}")
    sql("ALTER TABLE run ADD COLUMN isolation VARCHAR")
    # Two proxies on one schema-2 store could number a call twice: renumber those rollouts in
    # (seq, id) order so the unique index can be built; other rollouts keep their numbers.
    sql("""UPDATE call SET seq = (SELECT count(*) FROM call AS c WHERE c.rollout_id = call.rollout_id
                                  AND (c.seq < call.seq OR (c.seq = call.seq AND c.id < call.id)))
           WHERE rollout_id IN (SELECT rollout_id FROM call GROUP BY rollout_id, seq HAVING count(*) > 1)""")
    sql("DROP INDEX IF EXISTS ix_call_rollout_seq")
    sql("CREATE UNIQUE INDEX ix_call_rollout_seq ON call (rollout_id, seq)")
    sql("PRAGMA secure_delete=OFF")


# Numbered migrations: (version, name, function(connection)). A fresh database is created from the
# models above and stamped with every version here; an older one runs the versions it lacks.
# Add a migration for every schema change, e.g.:
#     (4, "rollout.cost", lambda c: c.exec_driver_sql("ALTER TABLE rollout ADD COLUMN cost FLOAT")),
Migration = tuple[int, str, Callable[[Any], None]]
MIGRATIONS: list[Migration] = [
    (1, "initial schema", lambda conn: None),
    # The dashboard counts a run's rollouts by state every second: without this index that is a scan.
    (2, "index rollout(run_id, status)",
     lambda conn: conn.exec_driver_sql(
         "CREATE INDEX IF NOT EXISTS ix_rollout_run_status ON rollout (run_id, status)")),
    (3, "rollout.key_hash, failure_kind; call sampling params, break_reason; run.isolation; "
        "unique call(rollout_id, seq)", _v3_hashed_keys_and_sampling),
]


# ---------------------------------------------------------------------------------------------
# Opening the store


def _sqlite_error(exc: Exception, path: Path) -> StoreError:
    msg = str(getattr(exc, "orig", exc))
    if "locked" in msg or "busy" in msg:
        return StoreError(f"the run store {path} is locked by another process; retry, or stop that process")
    if "disk is full" in msg or "database or disk is full" in msg:
        return StoreError(f"no space left for the run store {path}; free disk space and retry")
    if "malformed" in msg or "not a database" in msg:
        return StoreError(f"the run store {path} is damaged ({msg}); move it aside to start a new one")
    if "readonly" in msg or "unable to open" in msg:
        return StoreError(f"cannot write the run store {path} ({msg}); check its permissions")
    return StoreError(f"run store {path}: {msg}")


def _on_connect(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")  # durable at checkpoints; WAL keeps it consistent
    cur.execute("PRAGMA busy_timeout=10000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_engine(path: Path) -> Engine:
    eng = create_engine(f"sqlite:///{path}", connect_args={"check_same_thread": False, "timeout": 10})
    event.listen(eng, "connect", _on_connect)
    return eng


class Store:
    """A handle on one store file. Cheap to create; open one per process."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the data dir {self.path.parent}: {exc}") from None
        self.engine = make_engine(self.path)
        with self.guard():
            self._migrate()

    # Every public function runs inside `guard()`, which turns SQLite's errors into one clear line.
    @contextmanager
    def guard(self) -> Iterator[None]:
        try:
            yield
        except IntegrityError as exc:
            raise StoreError(f"run store {self.path}: {exc.orig}") from None
        except (DatabaseError, sqlite3.DatabaseError) as exc:
            raise _sqlite_error(exc, self.path) from None

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.guard(), Session(self.engine, expire_on_commit=False) as s:
            yield s

    def _migrate(self) -> None:
        with self.engine.begin() as conn:
            # One write transaction around the check and the migrations: two processes opening an
            # old (or new) store at once migrate it once, and a failed migration leaves no half.
            conn.exec_driver_sql("BEGIN IMMEDIATE")
            has_table = conn.exec_driver_sql(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='schema_migrations'"
            ).first()
            if not has_table:
                fresh = not conn.exec_driver_sql("SELECT 1 FROM sqlite_master WHERE type='table'").first()
                if not fresh:
                    raise StoreError(f"{self.path} is an SQLite file but not an OpenForge store")
                SQLModel.metadata.create_all(conn)
                for version, name, _ in MIGRATIONS:
                    conn.execute(
                        SchemaMigration.__table__.insert().values(version=version, name=name, applied_at=utcnow())
                    )
                return
            applied = {row[0] for row in conn.exec_driver_sql("SELECT version FROM schema_migrations")}
            newest = max(applied, default=0)
            if newest > MIGRATIONS[-1][0]:
                raise StoreError(
                    f"{self.path} has schema version {newest}, newer than this forge knows "
                    f"({MIGRATIONS[-1][0]}); upgrade forge"
                )
            for version, name, apply in MIGRATIONS:
                if version not in applied:
                    apply(conn)
                    conn.execute(
                        SchemaMigration.__table__.insert().values(version=version, name=name, applied_at=utcnow())
                    )

    def schema_version(self) -> int:
        with self.guard(), self.engine.connect() as conn:
            return int(conn.exec_driver_sql("SELECT max(version) FROM schema_migrations").scalar() or 0)

    def integrity_check(self) -> str:
        with self.guard(), self.engine.connect() as conn:
            return str(conn.exec_driver_sql("PRAGMA integrity_check").scalar())

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

    def update_run(self, run_id: str, **fields: Any) -> Run:
        with self.session() as s:
            run = s.get(Run, run_id)
            if run is None:
                raise NotFoundError(f"no run {run_id!r}")
            for key, value in fields.items():
                if key in ("config", "summary"):
                    key = f"{key}_json"
                setattr(run, key, value)
            s.add(run)
            s.commit()
            return run

    def set_run_status(self, run_id: str, status: str, *, error: str | None = None) -> Run:
        fields: dict[str, Any] = {"status": status}
        now = utcnow()
        if status == "running":
            fields["started_at"] = now
        if status in RUN_FINAL:
            fields["ended_at"] = now
        if error is not None:
            fields["error"] = error
        return self.update_run(run_id, **fields)

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
        key's hash is stored; the plain key is on the returned object (`rollout.key`) alone."""
        key = key or new_rollout_key()
        rollout = Rollout(id=new_id("ro"), run_id=run_id, task_id=task_id, step=step,
                          sample_index=sample_index, sandbox=sandbox, harness=harness, adapter=adapter,
                          key_hash=hash_key(key), status=status)
        with self.session() as s:
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
        """The rollout a plain credential belongs to (looked up by its hash), or None."""
        with self.session() as s:
            return s.exec(select(Rollout).where(Rollout.key_hash == hash_key(key))).first()

    def update_rollout(self, rollout_id: str, **fields: Any) -> Rollout:
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


def open_store(home: Path) -> Store:
    from openforge.paths import db_path

    return Store(db_path(home))

