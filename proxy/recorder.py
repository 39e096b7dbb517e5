"""The proxy's one writer (and its point reads): call rows go to SQLite through group commits.

Every request hands its write to the writer's queue and awaits it; the writer takes everything
queued so far and commits it in one transaction (inserts, then updates). Under load many calls
share one commit (no lock contention between requests); alone, a write is committed at once.
`begin` returns after the in-flight row is committed, `end` after the finished row is: the proxy
sends a response's last byte only after `end`, so nothing a harness saw is lost.

Why a writer thread and not `AsyncStore` (aiosqlite): each aiosqlite statement is a round trip
between the event loop and aiosqlite's thread, and a transaction is ~5 of them (checkout, begin,
execute, commit, reset). On a loaded machine every round trip waits for the scheduler: measured
~10 ms per operation on the project's 2-core box, which made recording most of the proxy's
overhead. Here a whole batch is one hop to one thread running the sync SQLAlchemy engine of
`openforge.store` (same tables, same type handling). Credential lookups are a single indexed read
in WAL mode (microseconds, never blocked by the writer), so they run inline on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import bindparam, func, select, text, update

from openforge.errors import StoreError
from openforge.store import Call, Store, _sqlite_error, utcnow

_CALL = Call.__table__  # type: ignore[attr-defined]
# One statement for every insert (so SQLAlchemy compiles it once): `seq` is the next number within
# the row's rollout, computed inside the same transaction.
_NEXT_SEQ = (select(func.coalesce(func.max(_CALL.c.seq), -1) + 1)
             .where(_CALL.c.rollout_id == bindparam("seq_rollout")).scalar_subquery())


@dataclass
class _Op:
    kind: str  # "insert" | "update"
    payload: Any
    done: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


def _as_columns(values: dict[str, Any]) -> dict[str, Any]:
    """Lists and dicts (token ids, logprobs, bodies) become the JSON text the store's columns hold."""
    return {k: json.dumps(v, ensure_ascii=False) if isinstance(v, (list, dict)) else v for k, v in values.items()}


class Recorder:
    def __init__(self, store: Store, *, max_batch: int = 512) -> None:
        self.store = store
        self.max_batch = max_batch
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forge-recorder")
        self._queue: asyncio.Queue[_Op | None] = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self.commits = 0  # transactions written (batching makes it < the number of writes)
        self.writes = 0

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="forge-recorder")

    async def stop(self) -> None:
        if self._task is not None:
            await self._queue.put(None)
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def close(self) -> None:
        self.pool.shutdown(wait=True)

    async def begin(self, row: dict[str, Any]) -> int:
        """Insert an in-flight call row (its `seq` is assigned here, in commit order); returns its id."""
        row = dict(row, status="in_flight", seq_rollout=row["rollout_id"])
        return int(await self._submit(_Op("insert", row)))

    async def end(self, call_id: int, values: dict[str, Any]) -> None:
        """Complete a call row (status ok/error plus the response); returns once committed."""
        await self._submit(_Op("update", (call_id, values)))

    async def _submit(self, op: _Op) -> Any:
        if self._task is None or self._task.done():
            raise StoreError("the proxy's recorder is not running")
        await self._queue.put(op)
        # Shielded: a client that disconnects must not cancel a write other requests share.
        return await asyncio.shield(op.done)

    async def _run(self) -> None:
        while True:
            first = await self._queue.get()
            if first is None:
                return
            ops = [first]
            stop = False
            while len(ops) < self.max_batch and not self._queue.empty():
                nxt = self._queue.get_nowait()
                if nxt is None:
                    stop = True
                    break
                ops.append(nxt)
            await self._commit(ops)
            if stop:
                return

    def _write(self, inserts: list[dict[str, Any]], updates: list[tuple[int, dict[str, Any]]]) -> list[int]:
        """In the writer thread: one transaction for the whole batch; returns the inserted ids."""
        ids: list[int] = []
        inserts = [_as_columns(row) for row in inserts]  # JSON encoding here, off the event loop
        updates = [(call_id, _as_columns(values)) for call_id, values in updates]
        with self.store.guard(), self.store.engine.begin() as conn:
            for row in inserts:
                values = {k: v for k, v in row.items() if k != "seq_rollout"}
                stmt = _CALL.insert().values(**{k: bindparam(k) for k in values}, seq=_NEXT_SEQ)
                result = conn.execute(stmt, {**values, "seq_rollout": row["seq_rollout"]})
                ids.append(int(result.inserted_primary_key[0]))
            for call_id, values in updates:
                conn.execute(update(_CALL).where(_CALL.c.id == call_id).values(**values))
        return ids

    async def _commit(self, ops: list[_Op]) -> None:
        inserts = [op for op in ops if op.kind == "insert"]
        updates = [op for op in ops if op.kind == "update"]
        loop = asyncio.get_running_loop()
        try:
            ids = await loop.run_in_executor(self.pool, self._write, [op.payload for op in inserts],
                                             [op.payload for op in updates])
        except Exception as exc:  # noqa: BLE001 - every waiter must hear about a failed commit
            err = exc if isinstance(exc, StoreError) else StoreError(f"recording calls failed: {exc}")
            for op in ops:
                if not op.done.done():
                    op.done.set_exception(err)
            return
        self.commits += 1
        self.writes += len(ops)
        for op, call_id in zip(inserts, ids):
            op.done.set_result(call_id)
        for op in updates:
            op.done.set_result(None)

    async def calls_of_rollout(self, rollout_id: str) -> list[Call]:
        """A rollout's finished calls in order (read in the writer thread: after every write queued)."""
        def read() -> list[Call]:
            calls = [c for c in self.store.list_calls(rollout_id=rollout_id) if c.status == "ok"]
            return sorted(calls, key=lambda c: (c.seq, c.id or 0))
        return await asyncio.get_running_loop().run_in_executor(self.pool, read)


class RolloutLookup:
    """Credential -> rollout, read inline: one indexed row in WAL mode takes microseconds."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn = sqlite3.connect(path, check_same_thread=False, timeout=5, isolation_level=None)
        self.conn.execute("PRAGMA query_only = ON")

    def by_key(self, api_key: str) -> dict[str, Any] | None:
        try:
            row = self.conn.execute("SELECT id, run_id, status, adapter FROM rollout WHERE api_key = ?",
                                    (api_key,)).fetchone()
        except sqlite3.Error as exc:
            raise _sqlite_error(exc, self.path) from None
        return None if row is None else {"id": row[0], "run_id": row[1], "status": row[2], "adapter": row[3]}

    def close(self) -> None:
        self.conn.close()


def interrupt_stale_calls(store_path: Path) -> int:
    """Calls left `in_flight` by a proxy that is gone become `interrupted`; returns how many.

    A call is stale when the process owning its run is dead (or unknown), or is this very process:
    a proxy starting now has served nothing yet, so in-flight rows of its own run predate it."""
    import psutil

    store = Store(store_path)
    try:
        with store.session() as s:
            conn = s.connection()
            rows = conn.execute(text(
                "SELECT DISTINCT call.run_id, run.owner_pid FROM call LEFT JOIN run ON run.id = call.run_id "
                "WHERE call.status = 'in_flight'")).all()
            stale = [run_id for run_id, pid in rows
                     if pid is None or pid == os.getpid() or not psutil.pid_exists(pid)]
            n = 0
            for run_id in stale:
                n += conn.execute(text(
                    "UPDATE call SET status='interrupted', ended_at=:now, error='the proxy stopped mid-call' "
                    "WHERE run_id=:r AND status='in_flight'"), {"r": run_id, "now": utcnow()}).rowcount
            s.commit()
        return n
    finally:
        store.close()
