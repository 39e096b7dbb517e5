"""Dashboard refresh: the time to read one screen's worth of a long run from the store (once a second).

Baseline: the store's ordinary list functions (whole rows: every rollout's stored stdout/stderr and
every call's request/response JSON). Measured: `read_snapshot`, which loads only the columns on screen.
The run: 2,000 rollouts with 32 KB of harness output each and 8,000 calls with 24 KB conversations.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from openforge.readmodel import read_snapshot
from openforge.store import Store, TrainStep, utcnow


def _fill(store: Store, n_rollouts: int, calls_per_rollout: int) -> str:
    run = store.create_run(name="bench", config={"trainer": {"steps": 50}})
    output = "harness log line\n" * 2000  # ~32 KB, the kind of tail the runner keeps
    request = {"messages": [{"role": "user", "content": "x" * 24_000}]}
    response = {"choices": [{"message": {"content": "y" * 500}}]}
    with store.engine.begin() as conn:
        rollouts, calls = [], []
        for i in range(n_rollouts):
            rid = f"ro-bench-{i:06d}"
            rollouts.append(dict(id=rid, run_id=run.id, task_id=f"t{i % 20}", step=i // 40, key_hash=f"k{i}",
                                 status="scored" if i < n_rollouts - 8 else "running", reward=(i % 5) / 4,
                                 stdout=output, stderr=output, created_at=utcnow(), n_calls=calls_per_rollout))
            calls.extend(dict(run_id=run.id, rollout_id=rid, seq=j, api="openai_chat", status="ok",
                              request_json=request, response_json=response, prompt_tokens=6000,
                              completion_tokens=120, started_at=utcnow()) for j in range(calls_per_rollout))
        conn.exec_driver_sql("PRAGMA synchronous=OFF")
        from openforge.store import Call, Rollout

        conn.execute(Rollout.__table__.insert(), rollouts)  # type: ignore[attr-defined]
        conn.execute(Call.__table__.insert(), calls)  # type: ignore[attr-defined]
    for step in range(n_rollouts // 40):
        store.add_train_step(TrainStep(run_id=run.id, step=step, loss=0.1, reward_mean=0.5, pass_rate=0.4))
    return run.id


def _naive(store: Store, run_id: str) -> None:
    """What a first dashboard would do: the list functions, whole rows."""
    store.get_run(run_id)
    store.list_train_steps(run_id)
    live = store.list_rollouts(run_id, status="running") + store.list_rollouts(run_id, status="pending")
    recent = store.list_rollouts(run_id, newest_first=True, limit=40)
    store.list_calls(run_id=run_id, limit=30, newest_first=True)
    assert live and recent


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def run(quick: bool = False) -> dict:
    n_rollouts, calls_per = (400, 4) if quick else (2000, 4)
    repeats = 5 if quick else 21
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "forge.db")
        run_id = _fill(store, n_rollouts, calls_per)
        _naive(store, run_id)  # warm the page cache for both
        baseline = _median_ms(lambda: _naive(store, run_id), repeats)
        snap = _median_ms(lambda: read_snapshot(store, run_id), repeats)
        store.close()
    result = {"rollouts": n_rollouts, "calls": n_rollouts * calls_per, "baseline_ms": round(baseline, 2),
              "snapshot_ms": round(snap, 2), "speedup": round(baseline / snap, 2)}
    print(f"dashboard refresh of a run with {n_rollouts} rollouts / {n_rollouts * calls_per} calls: "
          f"read_snapshot {snap:.2f} ms vs whole rows {baseline:.2f} ms (x{baseline / snap:.1f} faster)")
    return result


if __name__ == "__main__":
    run()
