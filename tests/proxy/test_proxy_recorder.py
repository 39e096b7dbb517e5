"""proxy/recorder.py: the proxy's one writer. Concurrent calls share commits, each waiter hears its own result,
every row lands numbered in commit order, and a write to a stopped recorder is an error, not a silent loss."""

from __future__ import annotations

import asyncio

import pytest

from openforge.async_store import AsyncStore
from openforge.errors import StoreError
from openforge.proxy.recorder import Recorder
from openforge.store import Store, utcnow


async def test_concurrent_calls_share_commits_and_lose_nothing(store: Store) -> None:
    run = store.create_run()
    rollout = store.create_rollout(run_id=run.id, task_id="t")
    astore = AsyncStore(store.path)
    rec = Recorder(astore)
    await rec.start()

    async def one_call(i: int) -> int:
        call_id = await rec.begin(dict(run_id=run.id, rollout_id=rollout.id, api="openai_chat", started_at=utcnow()))
        await rec.end(call_id, {"status": "ok", "completion_ids": [i]})
        return call_id

    ids = await asyncio.gather(*(one_call(i) for i in range(40)))
    assert len(set(ids)) == 40 and rec.writes == 80
    assert rec.commits < rec.writes  # batched: many calls in one transaction
    calls = await rec.calls_of_rollout(rollout.id)
    assert sorted(c.seq for c in calls) == list(range(40)) and {c.status for c in calls} == {"ok"}
    assert await rec.newest_call_id(rollout.id) == max(ids)
    await rec.stop()
    with pytest.raises(StoreError, match="recorder is not running"):
        await rec.begin(dict(run_id=run.id, rollout_id=rollout.id, started_at=utcnow()))
    await astore.close()
