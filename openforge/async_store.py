"""The async path into the store: the proxy's one handle, with one writer thread of its own.

The proxy records calls from many concurrent requests; it must not block its event loop on SQLite.
`AsyncStore` gives it the few operations it needs over the same tables as `openforge.store`;
batching lives in `openforge.proxy.recorder`, which owns the one writer task that calls `write_calls`.

A batch is written by one function on the store's writer thread (SQLAlchemy Core on a sync
connection: the same column types as `Store`), so it costs one hop from the event loop to that
thread and back. Through aiosqlite each statement was a hop (BEGIN, the numbering read, the insert,
the update: four or more), and on a loaded machine every hop waits for the scheduler: at one call at
a time those waits were most of the latency the proxy added.
Credential lookups are one indexed row read inline on a read-only connection (microseconds in WAL
mode, never blocked by the writer): cheaper than a hop to another thread on every request.
So forge does not depend on aiosqlite (docs/architecture.md, "The store from async code").
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import DateTime, select
from sqlalchemy.exc import DatabaseError

from openforge import db
from openforge.errors import StoreError
from openforge.store import LIVE_ROLLOUT, RUN_FINAL, Call, Recovered, Store, hash_key
from openforge.tables import JSON, decode_json, encode_json

_CALL = Call.__table__  # type: ignore[attr-defined]
T = TypeVar("T")


class _Busy(Exception):
    """The inline write found the write lock taken (by another process)."""

_LIVE_BY_KEY = (
    "SELECT rollout.id, rollout.run_id, rollout.status, rollout.adapter FROM rollout "
    "JOIN run ON run.id = rollout.run_id WHERE rollout.key_hash = ? "
    f"AND rollout.status IN ({', '.join(repr(s) for s in LIVE_ROLLOUT)}) "
    f"AND run.status NOT IN ({', '.join(repr(s) for s in RUN_FINAL)})"
)


class AsyncStore:
    """Async handle on a store file. The schema is created/migrated synchronously first."""

    def __init__(self, path: str | Path) -> None:
        self.path: Any = db.location(path)
        if db.is_url(self.path):  # PostgreSQL: everything through asyncpg (`_PgStore`)
            db.need_driver("asyncpg")
            Store(self.path).close()  # create or migrate the schema once
            self._pg: _PgStore | None = _PgStore(self.path)
            return
        self._pg = None
        Store(self.path).close()  # create or migrate the schema once (and refuse a 0-byte file)
        self.engine = db.sync_engine(self.path)  # used on the writer thread only
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forge-store")
        # Plain sqlite3 connections (with `db`'s settings) held out of the pool: the event loop's, for
        # small batches (see write_calls), and the writer thread's.
        self._inline: Any = None
        self._writer: Any = None
        self._reader = db.point_reader(self.path)

    async def _on_thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def recover(self) -> Recovered:
        """At a proxy's start (sync, before serving): what dead processes left behind becomes
        interrupted, and the keys of a crashed run's rollouts stop working (`Store.recover`)."""
        import psutil

        store = Store(self.path)
        try:
            return store.recover(alive=psutil.pid_exists)
        finally:
            store.close()

    async def close(self) -> None:
        if self._pg is not None:
            await self._pg.close()
            return
        self._reader.close()
        if self._inline is not None:
            self._inline.close()
            self._inline = None
        if self._writer is not None:
            await self._on_thread(self._writer.close)
            self._writer = None
        await self._on_thread(self.engine.dispose)
        self._thread.shutdown(wait=True)

    async def insert_calls(self, rows: Sequence[dict[str, Any]]) -> list[int]:
        """Insert call rows (dicts of `Call` columns) in one transaction; returns their ids in order."""
        return (await self.write_calls(rows, []))

    async def update_calls(self, updates: Sequence[tuple[int, dict[str, Any]]]) -> None:
        """Apply `(call id, {column: value})` updates in one transaction."""
        await self.write_calls([], updates)

    async def write_calls(self, inserts: Sequence[dict[str, Any]], updates: Sequence[tuple[int, dict[str, Any]]],
                          *, number: bool = False, inline: bool = False) -> list[int]:
        """One transaction: insert `inserts`, then apply `updates`; returns the inserted ids in order.

        With `number=True` each inserted row gets `seq` = the next number within its rollout, counted
        inside the same write transaction (so neither concurrent batches nor two processes on one
        file ever hand out a number twice; the unique index on (rollout_id, seq) backs it).

        Statements are few and multi-row: one read for the numbering, one INSERT ... RETURNING per
        column set, one executemany UPDATE per column set.

        With `inline=True` (a small batch) the transaction runs right here on the event loop, a few
        hundred microseconds, unless another process holds the write lock: then it goes to the
        writer thread, which waits for the lock. On a loaded machine a thread hop can cost more than
        the write itself (each wake-up waits for the scheduler).
        """
        if not inserts and not updates:
            return []
        if self._pg is not None:
            return await self._pg.write_calls(inserts, updates, number)
        if inline:
            try:
                return self._write_calls(inserts, updates, number, self._inline_conn())
            except _Busy:
                pass  # another process holds the write lock: wait for it on the thread, not here
        return await self._on_thread(self._write_calls, inserts, updates, number, None)

    def _inline_conn(self) -> sqlite3.Connection:
        """The event loop's own connection, which never waits for a lock (busy_timeout 0)."""
        if self._inline is None:
            self._inline = self.engine.raw_connection()  # held (checked out of the pool) until close
            self._inline.driver_connection.execute("PRAGMA busy_timeout=0")
        return self._inline.driver_connection

    def _thread_conn(self) -> sqlite3.Connection:
        if self._writer is None:
            self._writer = self.engine.raw_connection()
        return self._writer.driver_connection

    def _write_calls(self, inserts: Sequence[dict[str, Any]], updates: Sequence[tuple[int, dict[str, Any]]],
                     number: bool, inline: sqlite3.Connection | None) -> list[int]:
        # Plain sqlite3 with each value bound exactly as SQLAlchemy binds it (the columns' own bind
        # processors, the model's defaults): SQLAlchemy's per-statement machinery cost more than the
        # write itself, on the event loop or the thread alike.
        rows = [_CALL_BINDER.with_defaults(r) for r in inserts]
        conn = inline if inline is not None else self._thread_conn()
        try:
            try:
                conn.execute("BEGIN IMMEDIATE")  # the numbering read happens under the write lock
            except sqlite3.OperationalError as exc:
                if inline is not None and "locked" in str(exc):
                    raise _Busy() from None
                raise
            try:
                if number and rows:
                    _number(conn, rows)
                ids = [int(conn.execute(*_CALL_BINDER.insert(row)).fetchone()[0]) for row in rows]
                for call_id, values in updates:
                    conn.execute(*_CALL_BINDER.update(call_id, values))
                conn.commit()
            except BaseException:
                conn.rollback()
                raise
        except (sqlite3.Error, OSError, DatabaseError) as exc:
            raise db.store_error(exc, self.path) from None
        return ids

    async def rollout_by_key(self, key: str) -> dict[str, Any] | None:
        """The live rollout a plain credential belongs to (id, run_id, status, adapter), or None:
        unknown keys, ended rollouts and rollouts of ended runs alike."""
        if self._pg is not None:
            return await self._pg.rollout_by_key(key)
        try:
            row = self._reader.execute(_LIVE_BY_KEY, (hash_key(key),)).fetchone()
        except sqlite3.Error as exc:
            raise db.store_error(exc, self.path) from None
        return None if row is None else {"id": row[0], "run_id": row[1], "status": row[2], "adapter": row[3]}

    async def newest_call_id(self, rollout_id: str) -> int | None:
        """The id of a rollout's newest finished call: one indexed read inline, like `rollout_by_key`."""
        if self._pg is not None:
            return await self._pg.newest_call_id(rollout_id)
        try:
            row = self._reader.execute("SELECT max(id) FROM call WHERE rollout_id = ? AND status = 'ok'",
                                       (rollout_id,)).fetchone()
        except sqlite3.Error as exc:
            raise db.store_error(exc, self.path) from None
        return None if row is None or row[0] is None else int(row[0])

    async def calls_of_rollout(self, rollout_id: str, *, after_id: int = 0, last: int | None = None) -> list[Call]:
        """A rollout's finished calls in order (used to reuse sampled token ids after a restart, or
        after another proxy worker served the rollout): only those with id > `after_id`, only the
        `last` ones."""
        if self._pg is not None:
            return await self._pg.calls_of_rollout(rollout_id, after_id, last)
        return await self._on_thread(self._calls_of_rollout, rollout_id, after_id, last)

    def _calls_of_rollout(self, rollout_id: str, after_id: int, last: int | None) -> list[Call]:
        query = (select(_CALL).where(_CALL.c.rollout_id == rollout_id, _CALL.c.status == "ok", _CALL.c.id > after_id)
                 .order_by(_CALL.c.seq.desc()))
        if last is not None:
            query = query.limit(last)
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(query).all()
        except (DatabaseError, sqlite3.Error) as exc:
            raise db.store_error(exc, self.path) from None
        return [Call(**r._mapping) for r in reversed(rows)]


def _number(conn: sqlite3.Connection, rows: list[dict[str, Any]]) -> None:
    # One max(seq) read per rollout: SQLite answers it from the end of the (rollout_id, seq) index in
    # microseconds; a GROUP BY over several rollouts scans each one's whole index range instead
    # (0.3 ms per insert at 3,400 calls in one rollout, growing with every call).
    last = {r: conn.execute("SELECT max(seq) FROM call WHERE rollout_id = ?", (r,)).fetchone()[0]
            for r in sorted({r["rollout_id"] for r in rows})}
    for row in rows:
        nxt = -1 if last.get(row["rollout_id"]) is None else last[row["rollout_id"]]
        row["seq"] = last[row["rollout_id"]] = nxt + 1


class _Binder:
    """A table's rows as plain sqlite3 statements, each value converted by its column's own bind
    processor (JSON text, the datetime format, booleans) and missing columns given the model's
    defaults: the bytes in the file are the ones SQLAlchemy would have written."""

    def __init__(self, table: Any) -> None:
        from sqlalchemy.dialects import sqlite

        dialect = sqlite.dialect()
        self.table = table.name
        self.procs = {c.name: c.type.dialect_impl(dialect).bind_processor(dialect) for c in table.columns}
        self.defaults = {c.name: c.default for c in table.columns if c.default is not None}
        self._sql: dict[tuple[str, ...], str] = {}

    def with_defaults(self, row: dict[str, Any]) -> dict[str, Any]:
        out = dict(row)
        for name, default in self.defaults.items():
            if name not in out:
                out[name] = default.arg if default.is_scalar else default.arg(None)
        return out

    def _values(self, row: dict[str, Any]) -> list[Any]:
        out = []
        for name, value in row.items():
            if name not in self.procs:
                raise StoreError(f"the {self.table} table has no column {name!r}")
            proc = self.procs[name]
            out.append(proc(value) if proc is not None and value is not None else value)
        return out

    def insert(self, row: dict[str, Any]) -> tuple[str, list[Any]]:
        cols = tuple(row)
        sql = self._sql.get(cols)
        if sql is None:
            sql = self._sql[cols] = (f"INSERT INTO {self.table} ({', '.join(cols)}) VALUES "
                                     f"({', '.join('?' * len(cols))}) RETURNING id")
        return sql, self._values(row)

    def update(self, row_id: int, values: dict[str, Any]) -> tuple[str, list[Any]]:
        cols = ("update",) + tuple(values)
        sql = self._sql.get(cols)
        if sql is None:
            sql = self._sql[cols] = f"UPDATE {self.table} SET {', '.join(f'{c} = ?' for c in cols[1:])} WHERE id = ?"
        return sql, [*self._values(values), row_id]


_CALL_BINDER = _Binder(_CALL)


class _PgStore:
    """`AsyncStore` on PostgreSQL: asyncpg on the proxy's event loop (no thread), a small pool.

    Numbering across processes: each batch takes a transaction-scoped advisory lock per rollout it
    numbers (in sorted order, so two batches never deadlock), then reads max(seq) and inserts under
    it; another worker numbering the same rollout waits for the commit. The unique index on
    (rollout_id, seq) backs it, as on SQLite.
    """

    MAX_ROWS = 256  # rows per INSERT statement (35 columns: well under PostgreSQL's 32,767 parameters)

    def __init__(self, url: str) -> None:
        self.url = url
        self._pool: Any = None
        self._opening: asyncio.Lock | None = None
        self._json = {c.name for c in _CALL.columns if isinstance(c.type, JSON)}
        self._times = {c.name for c in _CALL.columns if isinstance(c.type, DateTime)}
        self._defaults = _CALL_BINDER.defaults

    def _error(self, exc: BaseException) -> StoreError:
        return db.store_error(exc, self.url)

    async def pool(self) -> Any:
        if self._pool is None:
            import asyncpg

            self._opening = self._opening or asyncio.Lock()
            async with self._opening:
                if self._pool is None:
                    dsn = "postgresql://" + db.pg_url(self.url, "asyncpg").partition("://")[2]
                    try:
                        self._pool = await asyncpg.create_pool(
                            dsn, min_size=1, max_size=4, timeout=db.PG_CONNECT_TIMEOUT_S,
                            server_settings={"timezone": "UTC"})
                    except (OSError, asyncio.TimeoutError, asyncpg.PostgresError) as exc:
                        raise self._error(exc) from None
        return self._pool

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    def _bind(self, name: str, value: Any) -> Any:
        if value is None:
            return None
        if name in self._json:
            return encode_json(value)
        if name in self._times and value.tzinfo is None:  # timestamptz: a naive time is UTC, as on SQLite
            return value.replace(tzinfo=UTC)
        return value

    def _row(self, row: dict[str, Any]) -> dict[str, Any]:
        out = dict(row)
        for name, default in self._defaults.items():
            if name not in out:
                out[name] = default.arg if default.is_scalar else default.arg(None)
        unknown = set(out) - set(_CALL.columns.keys())
        if unknown:
            raise StoreError(f"the call table has no column(s) {', '.join(sorted(unknown))}")
        return out

    async def write_calls(self, inserts: Sequence[dict[str, Any]], updates: Sequence[tuple[int, dict[str, Any]]],
                          number: bool) -> list[int]:
        import asyncpg

        rows = [self._row(r) for r in inserts]
        pool = await self.pool()
        try:
            async with pool.acquire() as conn, conn.transaction():
                if number and rows:
                    rollouts = sorted({r["rollout_id"] for r in rows})
                    await conn.execute(
                        "SELECT pg_advisory_xact_lock(hashtextextended(r, 0)) "
                        "FROM (SELECT r FROM unnest($1::text[]) AS r ORDER BY r) AS s", rollouts)
                    # One max(seq) per rollout, each answered from the end of the (rollout_id, seq)
                    # index; a GROUP BY would read every call of those rollouts (as in _number above).
                    last = {r[0]: r[1] for r in await conn.fetch(
                        "SELECT r, (SELECT max(seq) FROM call WHERE rollout_id = r) "
                        "FROM unnest($1::text[]) AS r", rollouts)}
                    for row in rows:
                        prev = last.get(row["rollout_id"])
                        row["seq"] = last[row["rollout_id"]] = 0 if prev is None else prev + 1
                ids = await self._insert(conn, rows)
                groups: dict[tuple[str, ...], list[list[Any]]] = {}
                for call_id, values in updates:
                    cols = tuple(values)
                    groups.setdefault(cols, []).append([*(self._bind(c, values[c]) for c in cols), call_id])
                for cols, args in groups.items():
                    sets = ", ".join(f"{c} = ${i}" for i, c in enumerate(cols, 1))
                    await conn.executemany(f"UPDATE call SET {sets} WHERE id = ${len(cols) + 1}", args)
        except (OSError, asyncio.TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise self._error(exc) from None
        return ids

    async def _insert(self, conn: Any, rows: list[dict[str, Any]]) -> list[int]:
        """Multi-row INSERT ... RETURNING per column set; ids matched back by (rollout_id, seq), which
        the unique index makes a key (PostgreSQL does not promise RETURNING's order)."""
        ids: dict[tuple[str, int], int] = {}
        by_cols: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for row in rows:
            by_cols.setdefault(tuple(row), []).append(row)
        for cols, group in by_cols.items():
            for start in range(0, len(group), self.MAX_ROWS):
                chunk = group[start:start + self.MAX_ROWS]
                n = len(cols)
                values = ", ".join("(" + ", ".join(f"${i * n + j + 1}" for j in range(n)) + ")"
                                   for i in range(len(chunk)))
                args = [self._bind(c, row[c]) for row in chunk for c in cols]
                for rec in await conn.fetch(f"INSERT INTO call ({', '.join(cols)}) VALUES {values} "
                                            "RETURNING id, rollout_id, seq", *args):
                    ids[(rec[1], rec[2])] = rec[0]
        return [ids[(row["rollout_id"], row["seq"])] for row in rows]

    async def _fetch(self, method: str, sql: str, *args: Any) -> Any:
        import asyncpg

        pool = await self.pool()
        try:
            return await getattr(pool, method)(sql, *args)
        except (OSError, asyncio.TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise self._error(exc) from None

    async def rollout_by_key(self, key: str) -> dict[str, Any] | None:
        row = await self._fetch("fetchrow", _LIVE_BY_KEY.replace("?", "$1"), hash_key(key))
        return None if row is None else {"id": row[0], "run_id": row[1], "status": row[2], "adapter": row[3]}

    async def newest_call_id(self, rollout_id: str) -> int | None:
        value = await self._fetch("fetchval", "SELECT max(id) FROM call WHERE rollout_id = $1 AND status = 'ok'",
                                  rollout_id)
        return None if value is None else int(value)

    async def calls_of_rollout(self, rollout_id: str, after_id: int, last: int | None) -> list[Call]:
        sql = "SELECT * FROM call WHERE rollout_id = $1 AND status = 'ok' AND id > $2 ORDER BY seq DESC"
        rows = await self._fetch("fetch", sql + (f" LIMIT {int(last)}" if last is not None else ""),
                                 rollout_id, after_id)
        out = []
        for rec in reversed(rows):
            row = dict(rec)
            for name in self._json:
                if isinstance(row.get(name), str):
                    row[name] = decode_json(row[name])
            out.append(Call(**row))
        return out
