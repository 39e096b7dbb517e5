"""The proxy's one writer (and its point reads): call rows go to SQLite through group commits.

Every request hands its write to the writer's queue and awaits it; the writer takes everything
queued so far and commits it in one transaction (inserts, then updates). Under load many calls
share one commit (no lock contention between requests); alone, a write is committed at once.
`begin` returns after the in-flight row is committed, `end` after the finished row is: the proxy
sends a response's last byte only after `end`, so nothing a harness saw is lost.

The writes go through `openforge.async_store.AsyncStore`, which writes a whole batch on its own
thread: the event loop never blocks on SQLite, and a batch costs one hop to that thread and back (on
a loaded machine every hop waits for the scheduler). Within it the batch is few statements
(`write_calls`: one numbering read, one multi-row INSERT ... RETURNING, one executemany UPDATE).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from openforge.errors import StoreError
from openforge.async_store import AsyncStore
from openforge.store import Call

INLINE_BATCH = 2  # a batch this small (one call alone: its begin, or its end) commits on the loop itself


@dataclass
class _Op:
    kind: str  # "insert" | "update"
    payload: Any
    done: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Recorder:
    def __init__(self, astore: AsyncStore, *, max_batch: int = 512) -> None:
        self.astore = astore  # its owner closes it
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
        return int(await self._submit(_Op("insert", dict(row, status="in_flight"))))

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
        try:
            ids = await self.astore.write_calls(
                [op.payload for op in inserts], [op.payload for op in updates],
                number=True, inline=len(ops) <= INLINE_BATCH)
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

    async def newest_call_id(self, rollout_id: str) -> int | None:
        """The id of the rollout's newest finished call in the store (any process's), or None."""
        return await self.astore.newest_call_id(rollout_id)

    async def calls_of_rollout(self, rollout_id: str, *, after_id: int = 0, last: int | None = None) -> list[Call]:
        """A rollout's finished calls in order (committed ones: `end` returns only after its commit)."""
        return await self.astore.calls_of_rollout(rollout_id, after_id=after_id, last=last)
