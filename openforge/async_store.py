"""The async write path into the store (aiosqlite through SQLAlchemy's asyncio engine).

The proxy records calls from many concurrent requests; it must not block its event loop on SQLite.
`AsyncStore` gives it a few coroutines over the same tables as `openforge.store`; batching lives in
`proxy.recorder`, which owns the one writer task that calls these.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import event, select, update
from sqlalchemy.exc import DatabaseError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from openforge.store import Call, Rollout, Store, _on_connect, _sqlite_error

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
        if not rows:
            return []
        # One multi-row INSERT ... RETURNING per batch (SQLAlchemy's insertmanyvalues), ids in row order.
        stmt = _CALL.insert().returning(_CALL.c.id, sort_by_parameter_order=True)
        # A multi-row statement needs one column set: rows are grouped by theirs, ids returned in input order.
        groups: dict[tuple[str, ...], list[int]] = {}
        for index, row in enumerate(rows):
            groups.setdefault(tuple(sorted(row)), []).append(index)
        ids = [0] * len(rows)
        try:
            async with self.engine.begin() as conn:
                for indexes in groups.values():
                    result = await conn.execute(stmt, [dict(rows[i]) for i in indexes])
                    for i, r in zip(indexes, result.all(), strict=True):
                        ids[i] = int(r[0])
            return ids
        except DatabaseError as exc:
            raise _sqlite_error(exc, self.path) from None

    async def update_calls(self, updates: Sequence[tuple[int, dict[str, Any]]]) -> None:
        """Apply `(call id, {column: value})` updates in one transaction."""
        if not updates:
            return
        try:
            async with self.engine.begin() as conn:
                for call_id, values in updates:
                    await conn.execute(update(_CALL).where(_CALL.c.id == call_id).values(**values))
        except DatabaseError as exc:
            raise _sqlite_error(exc, self.path) from None

    async def rollout_by_key(self, api_key: str) -> dict[str, Any] | None:
        """The rollout a credential belongs to (id, run_id, status, adapter), or None."""
        try:
            async with self.engine.connect() as conn:
                row = (await conn.execute(
                    select(_ROLLOUT.c.id, _ROLLOUT.c.run_id, _ROLLOUT.c.status, _ROLLOUT.c.adapter)
                    .where(_ROLLOUT.c.api_key == api_key)
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
