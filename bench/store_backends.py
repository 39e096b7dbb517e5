"""The store on SQLite vs PostgreSQL, measured in one run: recorded calls/s with full payloads
(2,048 + 256 tokens, request and response bodies), numbered as the proxy's recorder numbers them
(`AsyncStore.write_calls(..., number=True)`, batches of 64, 8 concurrent producers), then many
writer processes at once on one store (as many proxy workers record into one store).

Baseline: the SQLite file (the embedded default), measured in the same run. PostgreSQL is a throwaway
server on this machine (tests/pgserver.py) with its default durability (fsync on, synchronous_commit
on: every commit waits for its WAL flush), where SQLite runs WAL with synchronous=NORMAL (no flush per
commit). Needs PostgreSQL's server binaries and the `[postgres]` extra.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from bench.recording import _rows
from openforge.async_store import AsyncStore
from openforge.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import pgserver  # noqa: E402 - the tests' throwaway server

BATCH = 64
PRODUCERS = 8

# One writer process: `calls` rows for its own rollouts, batches of 64, 8 producers; prints calls/s
# measured from a common start signal (a line on stdin) to its last commit.
_WRITER = textwrap.dedent("""
    import asyncio, sys, time
    from bench.recording import _rows
    from openforge.async_store import AsyncStore
    from openforge.store import Store

    location, run_id, calls, batch, producers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    store = Store(location)
    rollouts = [store.create_rollout(run_id=run_id, task_id="t").id for _ in range(producers)]
    store.close()
    rows = _rows(run_id, rollouts[0], calls, 2048, 256)
    for i, row in enumerate(rows):
        row["rollout_id"] = rollouts[i % producers]
        del row["seq"]

    async def main():
        astore = AsyncStore(location)
        chunks = [rows[i:i + batch] for i in range(0, len(rows), batch)]
        print("ready", flush=True)
        sys.stdin.readline()
        t0 = time.perf_counter()
        async def producer():
            while chunks:
                await astore.write_calls(chunks.pop(), [], number=True)
        await asyncio.gather(*(producer() for _ in range(producers)))
        t = time.perf_counter() - t0
        await astore.close()
        print(t, flush=True)

    asyncio.run(main())
""")


def _server_cpu_s() -> float:
    """CPU seconds used so far by the PostgreSQL server's processes (0 when none runs)."""
    import psutil

    total = 0.0
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] == "postgres":
            try:
                times = proc.cpu_times()
                total += times.user + times.system
            except psutil.Error:
                continue
    return total


async def _one_process(location: str | Path, run_id: str, rollout_ids: list[str], n: int) -> tuple[float, float]:
    """(calls/s, CPU ms per call of this process and the database server together)."""
    rows = _rows(run_id, rollout_ids[0], n, 2048, 256)
    for i, row in enumerate(rows):
        row["rollout_id"] = rollout_ids[i % len(rollout_ids)]
        del row["seq"]
    astore = AsyncStore(location)
    chunks = [rows[i:i + BATCH] for i in range(0, len(rows), BATCH)]

    async def producer() -> None:
        while chunks:
            await astore.write_calls(chunks.pop(), [], number=True)

    start, cpu0, srv0 = time.perf_counter(), time.process_time(), _server_cpu_s()
    await asyncio.gather(*(producer() for _ in range(PRODUCERS)))
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu0 + _server_cpu_s() - srv0
    await astore.close()
    return n / elapsed, cpu / n * 1000


def _processes(location: str | Path, run_id: str, workers: int, calls_each: int) -> float:
    """Aggregate calls/s of `workers` writer processes started together on one store."""
    root = Path(__file__).resolve().parent.parent
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(location), run_id, str(calls_each), str(BATCH),
                               str(PRODUCERS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=root)
             for _ in range(workers)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        elapsed = []
        for p in procs:
            assert p.stdout is not None
            elapsed.append(float(p.stdout.readline()))  # from its go to its last commit
            p.wait(600)
        wall = max(elapsed)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return workers * calls_each / wall


def _fresh(kind: str, tmp: Path, pg: pgserver.PgServer, tag: str) -> tuple[str | Path, str]:
    location: str | Path = pg.create_db("bench") if kind == "postgresql" else tmp / f"{tag}.db"
    store = Store(location)
    run_id = store.create_run(kind="bench").id
    store.close()
    return location, run_id


def run(quick: bool = False) -> dict:
    n = 256 if quick else 1024
    repeats = 1 if quick else 3
    worker_counts = (1, 2) if quick else (1, 2, 4)
    pg = pgserver.start(fast=False)
    results: dict = {"payload": {"prompt_tokens": 2048, "completion_tokens": 256, "calls": n, "batch": BATCH,
                                 "producers": PRODUCERS}}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rates: dict[str, list[float]] = {"sqlite": [], "postgresql": []}
            cpu: dict[str, list[float]] = {"sqlite": [], "postgresql": []}
            for r in range(repeats):  # interleaved: both backends see the same machine load
                for kind in ("sqlite", "postgresql"):
                    location, run_id = _fresh(kind, Path(tmp), pg, f"one-{kind}-{r}")
                    store = Store(location)
                    rollouts = [store.create_rollout(run_id=run_id, task_id="t").id for _ in range(PRODUCERS)]
                    store.close()
                    rate, ms = asyncio.run(_one_process(location, run_id, rollouts, n))
                    rates[kind].append(rate)
                    cpu[kind].append(ms)
            for kind in rates:
                results[f"{kind}.calls_per_s"] = round(statistics.median(rates[kind]), 1)
                # CPU per recorded call, client + server: what decides the rate on an idle machine
                results[f"{kind}.cpu_ms_per_call"] = round(statistics.median(cpu[kind]), 3)
            results["postgresql_vs_sqlite"] = round(results["postgresql.calls_per_s"] / results["sqlite.calls_per_s"], 3)
            results["postgresql_vs_sqlite_cpu"] = round(
                results["postgresql.cpu_ms_per_call"] / results["sqlite.cpu_ms_per_call"], 3)
            for workers in worker_counts:
                for kind in ("sqlite", "postgresql"):
                    got = []
                    for r in range(repeats):
                        location, run_id = _fresh(kind, Path(tmp), pg, f"w{workers}-{kind}-{r}")
                        got.append(_processes(location, run_id, workers, max(n // workers, BATCH)))
                        check = Store(location)
                        assert check.integrity_check() == "ok"
                        check.close()
                    results[f"{kind}.workers_{workers}_calls_per_s"] = round(statistics.median(got), 1)
            for kind in ("sqlite", "postgresql"):
                top = worker_counts[-1]
                results[f"{kind}.workers_{top}_vs_1"] = round(
                    results[f"{kind}.workers_{top}_calls_per_s"] / results[f"{kind}.workers_1_calls_per_s"], 3)
    finally:
        pg.stop()
    print(f"store write rate, {n} calls of 2,048+256 tokens, batches of {BATCH}, {PRODUCERS} producers:")
    print(f"  SQLite:     {results['sqlite.calls_per_s']:8.1f} calls/s")
    print(f"  PostgreSQL: {results['postgresql.calls_per_s']:8.1f} calls/s  ({results['postgresql_vs_sqlite']:.2f}x SQLite)")
    print(f"  CPU per call (client + server): SQLite {results['sqlite.cpu_ms_per_call']:.3f} ms, "
          f"PostgreSQL {results['postgresql.cpu_ms_per_call']:.3f} ms")
    for workers in worker_counts:
        print(f"  {workers} writer process(es): SQLite {results[f'sqlite.workers_{workers}_calls_per_s']:8.1f}, "
              f"PostgreSQL {results[f'postgresql.workers_{workers}_calls_per_s']:8.1f} calls/s")
    return results
