"""The store's schema versions: a small numbered list, applied in order and remembered in the
`schema_migrations` table, in the spirit of simonw/llm.

A fresh database is created from the models (`openforge.tables`) and stamped with the newest version
(what Alembic calls `create_all` + `stamp head`); an older database runs only the migrations it lacks.
We chose this over Alembic because the schema is small, every change is an `ALTER TABLE` or a new
table, and users must be able to open any old store without an Alembic environment next to it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Connection
from sqlmodel import SQLModel

from openforge.db import redact
from openforge.errors import StoreError
from openforge.tables import Judgement, SchemaMigration, hash_key, utcnow

SCHEMA_VERSION = 8


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


def _v4_images(conn: Any) -> None:
    """Schema 4: the sha256 ids of the images a call or a trajectory segment carried (a JSON column:
    TEXT in SQLite, json in PostgreSQL, as `openforge.tables.JSON` creates it)."""
    kind = "JSON" if conn.dialect.name == "postgresql" else "TEXT"
    for table in ("call", "trajectory"):
        conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN images {kind}")


def _v5_teacher_calls(conn: Any) -> None:
    """Schema 5: a teacher's calls (engine.kind = "remote") are re-tokenised, and their upstream retries counted."""
    false = "false" if conn.dialect.name == "postgresql" else "0"
    conn.exec_driver_sql(f"ALTER TABLE call ADD COLUMN retokenized BOOLEAN NOT NULL DEFAULT {false}")
    conn.exec_driver_sql("ALTER TABLE call ADD COLUMN upstream_retries INTEGER NOT NULL DEFAULT 0")


def _v6_judgements(conn: Any) -> None:
    """Schema 6: the `judgement` table, one row per call of a task's judge (its DDL from the model)."""
    Judgement.__table__.create(conn)  # type: ignore[attr-defined]


def _v7_call_roles(conn: Any) -> None:
    """Schema 7: the policy's answers in a call's prompt, and a harness's side calls by name."""
    conn.exec_driver_sql("ALTER TABLE call ADD COLUMN policy_turns INTEGER")
    conn.exec_driver_sql("ALTER TABLE call ADD COLUMN side VARCHAR")


def _v8_policy_versions(conn: Any) -> None:
    """Schema 8: the policy version a run serves and each rollout was created under (older rows: unknown)."""
    for table in ("run", "rollout"):
        conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN policy_version INTEGER")


# Numbered migrations: (version, name, function(connection)). A fresh database is created from the
# models above and stamped with every version here; an older one runs the versions it lacks.
# They run on SQLite and PostgreSQL alike (`conn.dialect.name` tells them apart where SQL differs;
# `ALTER TABLE t ADD COLUMN c TEXT` is the same on both). A PostgreSQL store is created at the newest
# version of the forge that first opened it (4 or later); older migrations never run there.
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
    # The images a call or a segment carried (sha256 ids of runs/<run>/images/ files, see openforge/image_store.py).
    (4, "call.images, trajectory.images", _v4_images),
    # A teacher's calls: token ids from the student's tokenizer, not sampled; retries of the upstream.
    (5, "call.retokenized, call.upstream_retries", _v5_teacher_calls),
    # A task's judge: its prompt, reply and parsed score, per rollout (rollouts/tasks/judge.py).
    (6, "judgement table", _v6_judgements),
    # A prompt refused as over the context: the harness's own (no answer of the policy in it) or the
    # policy's; a harness's background calls, tagged from its spec and not trained on (issue 44).
    (7, "call.policy_turns, call.side", _v7_call_roles),
    # Which weights sampled a rollout, for full fine-tuning too (its rollouts name no adapter): what a
    # resume checks a finished group's staleness by (trainer/resume.py).
    (8, "run.policy_version, rollout.policy_version", _v8_policy_versions),
]


# Any constant: the key of the transaction-scoped advisory lock that serialises migrations on PostgreSQL.
_PG_MIGRATION_LOCK = 0x0F0E6E


def migrate(conn: Connection, path: str | Path) -> None:
    """Create or upgrade the schema on `conn` (inside the caller's transaction), SQLite or PostgreSQL."""
    # One write transaction around the check and the migrations: two processes opening an old (or
    # new) store at once migrate it once, and a failed migration leaves no half. PostgreSQL's DDL is
    # transactional too; an advisory lock stands in for SQLite's BEGIN IMMEDIATE.
    postgres = conn.dialect.name == "postgresql"
    if postgres:
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_MIGRATION_LOCK})")
        has_table = conn.exec_driver_sql("SELECT to_regclass('schema_migrations')").scalar() is not None
        any_table = conn.exec_driver_sql(
            "SELECT 1 FROM information_schema.tables WHERE table_schema = current_schema()").first()
        kind = "a PostgreSQL database"
    else:
        conn.exec_driver_sql("BEGIN IMMEDIATE")
        has_table = conn.exec_driver_sql(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='schema_migrations'").first() is not None
        any_table = conn.exec_driver_sql("SELECT 1 FROM sqlite_master WHERE type='table'").first()
        kind = "an SQLite file"
    if not has_table:
        if any_table:
            raise StoreError(f"{redact(path)} is {kind} but not an OpenForge store")
        SQLModel.metadata.create_all(conn)
        for version, name, _ in MIGRATIONS:
            _stamp(conn, version, name)
        return
    applied = {row[0] for row in conn.exec_driver_sql("SELECT version FROM schema_migrations")}
    newest = max(applied, default=0)
    if newest > MIGRATIONS[-1][0]:
        raise StoreError(f"{redact(path)} has schema version {newest}, newer than this forge knows "
                         f"({MIGRATIONS[-1][0]}); upgrade forge")
    for version, name, apply in MIGRATIONS:
        if version not in applied:
            apply(conn)
            _stamp(conn, version, name)


def _stamp(conn: Connection, version: int, name: str) -> None:
    conn.execute(SchemaMigration.__table__.insert().values(  # type: ignore[attr-defined]
        version=version, name=name, applied_at=utcnow()))
