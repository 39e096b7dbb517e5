"""The proxy's one writer: call rows go to SQLite through a single task doing group commits.

Every request hands its write to the writer's queue and awaits it; the writer takes everything
queued so far and commits it in one transaction (inserts, then updates). Under load many calls
share one commit (one fsync at WAL checkpoints, no lock contention between requests); alone, a write
is committed at once. `begin` returns after the in-flight row is committed, `end` after the finished
row is: the proxy sends a response's last byte only after `end`, so nothing a harness saw is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import func, select, text, update

from openforge.async_store import AsyncStore
from openforge.errors import StoreError
from openforge.store import Call, Store, utcnow

_CALL = Call.__table__  # type: ignore[attr-defined]


@dataclass
class _Op:
    kind: str  # "insert" | "update"
    payload: Any
    done: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Recorder:
    def __init__(self, store: AsyncStore, *, max_batch: int = 512) -> None:
        self.store = store
        self.max_batch = max_batch
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

    async def begin(self, row: dict[str, Any]) -> int:
        """Insert an in-flight call row (its `seq` is assigned here, in commit order); returns its id."""
        row = dict(row, status="in_flight")
        row["seq"] = (select(func.coalesce(func.max(_CALL.c.seq), -1) + 1)
                      .where(_CALL.c.rollout_id == row["rollout_id"]).scalar_subquery())
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

    async def _commit(self, ops: list[_Op]) -> None:
        inserts = [op for op in ops if op.kind == "insert"]
        updates = [op for op in ops if op.kind == "update"]
        ids: list[int] = []
        try:
            async with self.store.engine.begin() as conn:  # one transaction for the whole batch
                for op in inserts:
                    result = await conn.execute(_CALL.insert().values(**op.payload))
                    ids.append(int(result.inserted_primary_key[0]))
                for op in updates:
                    call_id, values = op.payload
                    await conn.execute(update(_CALL).where(_CALL.c.id == call_id).values(**values))
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
