"""Timing helpers the benchmarks share: percentiles and a timed loop of an async call."""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable


def percentile(samples: list[float], q: float) -> float:
    """The sample at quantile q (nearest rank): p99 of 40 samples is the largest but one."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def time_calls(fn: Callable[[], Awaitable[None]], n: int) -> dict[str, float]:
    """p50/p99 milliseconds of `n` awaited calls, after one warm-up call (imports, first connections)."""
    await fn()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return {"p50_ms": round(statistics.median(samples), 2), "p99_ms": round(percentile(samples, 0.99), 2), "n": n}
