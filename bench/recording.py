"""Recording: calls/s the store sustains with full token/logprob payloads (WAL), batched vs not.

Baseline: one transaction per call (what a naive recorder does). Measured: the same rows committed in
batches through `AsyncStore.insert_calls`, with 8 concurrent producers, as the proxy's recorder does.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

from openforge.async_store import AsyncStore
from openforge.store import Store, utcnow


def _rows(run_id: str, rollout_id: str, n: int, prompt_len: int, completion_len: int) -> list[dict]:
    rng = random.Random(0)
    prompt = [rng.randrange(150_000) for _ in range(prompt_len)]
    completion = [rng.randrange(150_000) for _ in range(completion_len)]
    logprobs = [round(-rng.random() * 5, 6) for _ in range(completion_len)]
    request = {"model": "m", "messages": [{"role": "user", "content": "x" * 4000}]}
    response = {"choices": [{"message": {"content": "y" * 1000}}]}
    return [dict(run_id=run_id, rollout_id=rollout_id, seq=i, api="openai_chat", status="ok",
                 request_json=request, response_json=response, prompt_ids=prompt, completion_ids=completion,
                 logprobs=logprobs, prompt_tokens=prompt_len, completion_tokens=completion_len,
                 started_at=utcnow(), ended_at=utcnow()) for i in range(n)]


async def _measure(path: Path, rows: list[dict], batch: int, producers: int) -> float:
    astore = AsyncStore(path)
    chunks = [rows[i:i + batch] for i in range(0, len(rows), batch)]
    queue: asyncio.Queue[list[dict]] = asyncio.Queue()
    for chunk in chunks:
        queue.put_nowait(chunk)

    async def producer() -> None:
        while not queue.empty():
            await astore.insert_calls(queue.get_nowait())

    start = time.perf_counter()
    await asyncio.gather(*(producer() for _ in range(producers)))
    elapsed = time.perf_counter() - start
    await astore.close()
    return len(rows) / elapsed


def run(quick: bool = False) -> dict:
    n = 200 if quick else 1000
    repeats = 1 if quick else 3
    prompt_len, completion_len = 2048, 256
    results: dict[str, list[float]] = {"one_per_txn": [], "batched_64": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            for name, batch in (("one_per_txn", 1), ("batched_64", 64)):
                path = Path(tmp) / f"{name}-{r}.db"
                store = Store(path)
                run_row = store.create_run(kind="bench")
                ro = store.create_rollout(run_id=run_row.id, task_id="t")
                store.close()
                rows = _rows(run_row.id, ro.id, n, prompt_len, completion_len)
                results[name].append(asyncio.run(_measure(path, rows, batch, producers=8)))
    base = statistics.median(results["one_per_txn"])
    best = statistics.median(results["batched_64"])
    out = {
        "payload": {"prompt_tokens": prompt_len, "completion_tokens": completion_len, "calls": n},
        "calls_per_s_one_per_txn": round(base, 1),
        "calls_per_s_batched_64": round(best, 1),
        "ratio_batched_vs_one_per_txn": round(best / base, 2),
    }
    print(f"recording {n} calls ({prompt_len}+{completion_len} tokens each, JSON payloads, WAL):")
    print(f"  one transaction per call: {base:8.1f} calls/s")
    print(f"  batches of 64:            {best:8.1f} calls/s  ({best / base:.2f}x)")
    return out
