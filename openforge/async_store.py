"""The async path into the store: the proxy's one handle, with one writer thread of its own.

The proxy records calls from many concurrent requests; it must not block its event loop on SQLite.
`AsyncStore` gives it the few operations it needs over the same tables as `openforge.store`;
batching lives in `proxy.recorder`, which owns the one writer task that calls `write_calls`.

A batch is written by one function on the store's writer thread (SQLAlchemy Core on a sync
connection: the same column types as `Store`), so it costs one hop from the event loop to that
thread and back. Through aiosqlite each statement was a hop (BEGIN, the numbering read, the insert,
the update: four or more), and on a loaded machine every hop waits for the scheduler: at one call at
a time those waits were most of the latency the proxy added.
Credential lookups are one indexed row read inline on a read-only connection (microseconds in WAL
mode, never blocked by the writer): cheaper than a hop to aiosqlite's thread on every request.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.exc import DatabaseError, OperationalError

from openforge import db
from openforge.store import LIVE_ROLLOUT, RUN_FINAL, Call, Recovered, Store, hash_key

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
        self.path = Path(path)
        Store(self.path).close()  # create or migrate the schema once (and refuse a 0-byte file)
        self.engine = db.sync_engine(self.path)  # used on the writer thread only
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forge-store")
        self._inline: Any = None  # the event loop's connection for small batches (see write_calls)
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
        self._reader.close()
        if self._inline is not None:
            self._inline.close()
            self._inline = None
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
        if inline:
            try:
                return self._write_calls(inserts, updates, number, self._inline_conn())
            except _Busy:
                pass  # another process holds the write lock: wait for it on the thread, not here
        return await self._on_thread(self._write_calls, inserts, updates, number, None)

    def _inline_conn(self) -> Any:
        """The event loop's own connection, which never waits for a lock (busy_timeout 0)."""
        if self._inline is None:
            self._inline = self.engine.connect()
            self._inline.exec_driver_sql("PRAGMA busy_timeout=0")
            self._inline.commit()
        return self._inline

    def _write_calls(self, inserts: Sequence[dict[str, Any]], updates: Sequence[tuple[int, dict[str, Any]]],
                     number: bool, inline: Any) -> list[int]:
        rows = [dict(r) for r in inserts]
        ids = [0] * len(rows)
        try:
            with (inline.begin() if inline is not None else self.engine.begin()) as conn:
                conn = inline if inline is not None else conn
                # IMMEDIATE: the numbering read happens under the write lock.
                try:
                    conn.exec_driver_sql("BEGIN IMMEDIATE")
                except OperationalError as exc:
                    if inline is not None and "locked" in str(exc.orig):
                        raise _Busy() from None
                    raise
                if number and rows:
                    _number(conn, rows)
                stmt = _CALL.insert().returning(_CALL.c.id, sort_by_parameter_order=True)
                for indexes in _by_columns(rows).values():
                    result = conn.execute(stmt, [rows[i] for i in indexes])
                    for i, r in zip(indexes, result.all(), strict=True):
                        ids[i] = int(r[0])
                values = [dict(v, _call_id=call_id) for call_id, v in updates]
                for indexes in _by_columns(values).values():
                    cols = [c for c in values[indexes[0]] if c != "_call_id"]
                    stmt_u = (update(_CALL).where(_CALL.c.id == bindparam("_call_id"))
                              .values({c: bindparam(c) for c in cols}))
                    conn.execute(stmt_u, [values[i] for i in indexes])
        except (DatabaseError, sqlite3.Error, OSError) as exc:
            raise db.store_error(exc, self.path) from None
        return ids

    async def rollout_by_key(self, key: str) -> dict[str, Any] | None:
        """The live rollout a plain credential belongs to (id, run_id, status, adapter), or None:
        unknown keys, ended rollouts and rollouts of ended runs alike."""
        try:
            row = self._reader.execute(_LIVE_BY_KEY, (hash_key(key),)).fetchone()
        except sqlite3.Error as exc:
            raise db.store_error(exc, self.path) from None
        return None if row is None else {"id": row[0], "run_id": row[1], "status": row[2], "adapter": row[3]}

    async def newest_call_id(self, rollout_id: str) -> int | None:
        """The id of a rollout's newest finished call: one indexed read inline, like `rollout_by_key`."""
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


def _number(conn: Any, rows: list[dict[str, Any]]) -> None:
    rollouts = sorted({r["rollout_id"] for r in rows})
    last = dict((conn.execute(
        select(_CALL.c.rollout_id, func.max(_CALL.c.seq))
        .where(_CALL.c.rollout_id.in_(rollouts)).group_by(_CALL.c.rollout_id))).all())
    for row in rows:
        nxt = -1 if last.get(row["rollout_id"]) is None else last[row["rollout_id"]]
        row["seq"] = last[row["rollout_id"]] = nxt + 1


def _by_columns(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, ...], list[int]]:
    """Row indexes grouped by column set: a multi-row statement needs one."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for index, row in enumerate(rows):
        groups.setdefault(tuple(sorted(row)), []).append(index)
    return groups
