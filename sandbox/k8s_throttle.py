"""Client-side throttling of Kubernetes API calls, shared by the cluster client (sandbox/k8s_client.py)
and the exec stream (sandbox/k8s_exec.py): rate limits, and how long to wait after a 429 or 503."""

from __future__ import annotations

import random
import threading
import time

MAX_THROTTLE_RETRIES = 6


class RateLimiter:
    """A token bucket as reservations (GCRA): `reserve()` says how long to wait for the next slot, so
    callers on any event loop or thread can share it."""

    def __init__(self, per_second: float, burst: int) -> None:
        self.interval = 1.0 / per_second if per_second > 0 else 0.0
        self.burst = max(1, burst)
        self._tat = 0.0  # theoretical arrival time of the next request
        self._lock = threading.Lock()

    def reserve(self) -> float:
        if not self.interval:
            return 0.0
        with self._lock:
            now = time.monotonic()
            self._tat = max(self._tat, now) + self.interval
            return max(0.0, self._tat - now - self.burst * self.interval)


def backoff_s(attempt: int, retry_after: float | None) -> float:
    """The server's Retry-After when it gave one, else 0.5 s doubling to 15 s; either with up to 50%
    jitter on top, so a throttled crowd does not come back in one burst."""
    base = retry_after if retry_after is not None else min(0.5 * 2**attempt, 15.0)
    return base * (1 + random.random() * 0.5)
