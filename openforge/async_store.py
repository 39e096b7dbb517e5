"""The async write path into the store (aiosqlite through SQLAlchemy's asyncio engine).

The proxy records calls from many concurrent requests; it must not block its event loop on SQLite.
`AsyncStore` gives it a few coroutines over the same tables as `openforge.store`; batching lives in
`proxy.recorder`, which owns the one writer task that calls these.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import bindparam, event, func, select, update
from sqlalchemy.exc import DatabaseError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from openforge.store import Call, Rollout, Store, _on_connect, _sqlite_error, hash_key

_CALL = Call.__table__  # type: ignore[attr-defined]
_ROLLOUT = Rollout.__table__  # type: ignore[attr-defined]


class AsyncStore:
    """Async handle on a store file. The schema is created/migrated by the sync `Store` first."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        Store(self.path).close()  # create or migrate the schema once, synchronously
        self.engine: AsyncEngine = create_async_engine(
            f"sqlite+aiosqlite:///{self.path}", connect_args={"timeout": 10}
        )
        event.listen(self.engine.sync_engine, "connect", _on_connect)

    async def close(self) -> None:
        await self.engine.dispose()

    async def insert_calls(self, rows: Sequence[dict[str, Any]]) -> list[int]:
        """Insert call rows (dicts of `Call` columns) in one transaction; returns their ids in order."""
        return (await self.write_calls(rows, []))

    async def update_calls(self, updates: Sequence[tuple[int, dict[str, Any]]]) -> None:
        """Apply `(call id, {column: value})` updates in one transaction."""
        await self.write_calls([], updates)

    async def write_calls(self, inserts: Sequence[dict[str, Any]], updates: Sequence[tuple[int, dict[str, Any]]],
                          *, number: bool = False) -> list[int]:
        """One transaction: insert `inserts`, then apply `updates`; returns the inserted ids in order.

        With `number=True` each inserted row gets `seq` = the next number within its rollout, counted
        inside the same transaction (so concurrent batches never hand out a number twice).

        Statements are few and multi-row (an aiosqlite statement is a hop to its thread): one read for
        the numbering, one INSERT ... RETURNING per column set, one executemany UPDATE per column set.
        """
        if not inserts and not updates:
            return []
        rows = [dict(r) for r in inserts]
        ids = [0] * len(rows)
        try:
            async with self.engine.begin() as conn:
                # IMMEDIATE: the numbering read happens under the write lock, so two proxies (two
                # processes) on one store never read the same last seq; the unique index backs it.
                await conn.exec_driver_sql("BEGIN IMMEDIATE")
                if number and rows:
                    rollouts = sorted({r["rollout_id"] for r in rows})
                    last = dict((await conn.execute(
                        select(_CALL.c.rollout_id, func.max(_CALL.c.seq))
                        .where(_CALL.c.rollout_id.in_(rollouts)).group_by(_CALL.c.rollout_id))).all())
                    for row in rows:
                        nxt = -1 if last.get(row["rollout_id"]) is None else last[row["rollout_id"]]
                        row["seq"] = last[row["rollout_id"]] = nxt + 1
                stmt = _CALL.insert().returning(_CALL.c.id, sort_by_parameter_order=True)
                for indexes in _by_columns(rows).values():
                    result = await conn.execute(stmt, [rows[i] for i in indexes])
                    for i, r in zip(indexes, result.all(), strict=True):
                        ids[i] = int(r[0])
                values = [dict(v, _call_id=call_id) for call_id, v in updates]
                for indexes in _by_columns(values).values():
                    cols = [c for c in values[indexes[0]] if c != "_call_id"]
                    stmt_u = (update(_CALL).where(_CALL.c.id == bindparam("_call_id"))
                              .values({c: bindparam(c) for c in cols}))
                    await conn.execute(stmt_u, [values[i] for i in indexes])
        except DatabaseError as exc:
            raise _sqlite_error(exc, self.path) from None
        return ids

    async def rollout_by_key(self, key: str) -> dict[str, Any] | None:
        """The rollout a plain credential belongs to (id, run_id, status, adapter), or None."""
        try:
            async with self.engine.connect() as conn:
                row = (await conn.execute(
                    select(_ROLLOUT.c.id, _ROLLOUT.c.run_id, _ROLLOUT.c.status, _ROLLOUT.c.adapter)
                    .where(_ROLLOUT.c.key_hash == hash_key(key))
                )).first()
        except DatabaseError as exc:
            raise _sqlite_error(exc, self.path) from None
        return dict(row._mapping) if row else None

    async def calls_of_rollout(self, rollout_id: str) -> list[dict[str, Any]]:
        """A rollout's finished calls in order (used to reuse sampled token ids)."""
        try:
            async with self.engine.connect() as conn:
                rows = (await conn.execute(
                    select(_CALL).where(_CALL.c.rollout_id == rollout_id, _CALL.c.status == "ok")
                    .order_by(_CALL.c.seq)
                )).all()
        except DatabaseError as exc:
            raise _sqlite_error(exc, self.path) from None
        return [dict(r._mapping) for r in rows]


def _by_columns(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, ...], list[int]]:
    """Row indexes grouped by column set: a multi-row statement needs one."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for index, row in enumerate(rows):
        groups.setdefault(tuple(sorted(row)), []).append(index)
    return groups
