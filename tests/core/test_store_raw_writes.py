"""AsyncStore writes call rows with plain sqlite3: the bytes in the file must be those SQLAlchemy
(the `Store` path) writes for the same row, and reads back the same."""

from __future__ import annotations

import math
import sqlite3

from openforge.async_store import AsyncStore
from openforge.store import Call, Store, utcnow


async def test_raw_writes_store_the_same_bytes_as_sqlalchemy(store: Store) -> None:
    run = store.create_run()
    rollout = store.create_rollout(run_id=run.id, task_id="t")
    started = utcnow()
    row = dict(run_id=run.id, rollout_id=rollout.id, api="openai_chat", stream=True, request_json='{"a": 1}',
               prompt_ids=[1, 2, 3], logprobs=[-0.5, None], tool_calls_json=[{"id": "c", "name": "bash"}],
               temperature=0.7, started_at=started)
    via_orm = store.add_call(Call(**row, seq=0, status="in_flight"))
    astore = AsyncStore(store.path)
    try:
        (raw_id,) = await astore.write_calls([row], [], number=True, inline=True)
        (thread_id,) = await astore.write_calls([row], [], number=True)
        await astore.write_calls([], [(raw_id, {"status": "ok", "ended_at": started, "completion_ids": [9],
                                                "tool_parse_error": True, "latency_ms": math.pi})], inline=True)
    finally:
        await astore.close()
    with store.session() as s:
        orm_row = s.get(Call, via_orm.id)
        orm_row.status, orm_row.ended_at, orm_row.completion_ids = "ok", started, [9]
        orm_row.tool_parse_error, orm_row.latency_ms = True, math.pi
        s.add(orm_row)
        s.commit()
    conn = sqlite3.connect(store.path)
    try:
        cols = [r[1] for r in conn.execute("PRAGMA table_info(call)")]
        rows = {r[0]: r for r in conn.execute("SELECT * FROM call")}
    finally:
        conn.close()
    skip = {cols.index("id"), cols.index("seq")}
    differ = [cols[i] for i in range(len(cols)) if i not in skip and rows[via_orm.id][i] != rows[raw_id][i]]
    assert differ == []
    assert [rows[i][cols.index("seq")] for i in (via_orm.id, raw_id, thread_id)] == [0, 1, 2]
    assert store.get_call(raw_id).model_dump(exclude={"id", "seq"}) == store.get_call(via_orm.id).model_dump(
        exclude={"id", "seq"})
