"""Concurrent-call slots: at most `size` calls at the engine at once, a bounded queue behind them.

A `Slot` is released exactly once, by whoever holds it last: the pipeline for a whole-body answer,
the stream's body for a streamed one (`hand_over` passes it on, so the pipeline's own release
becomes a no-op).
"""

from __future__ import annotations

import asyncio

from openforge.proxy.calls import APIError


class Slot:
    def __init__(self, slots: Slots) -> None:
        self._slots = slots
        self._held = True

    def hand_over(self) -> Slot:
        """The slot for its next holder (the stream's body); this handle's `release` does nothing now."""
        self._held = False
        return Slot(self._slots)

    def release(self) -> None:
        if self._held:
            self._held = False
            self._slots._give_back()


class Slots:
    def __init__(self, size: int, *, queue_limit: int, wait_s: float) -> None:
        self.size = size
        self.queue_limit = queue_limit
        self.wait_s = wait_s
        self.pending = 0  # calls holding or waiting for a slot
        self._free = asyncio.Semaphore(size)

    async def take(self) -> Slot:
        """A slot, queueing behind the calls that hold them; refused (429, retryable) once
        `queue_limit` calls are already in: a harness retries later rather than piling up connections."""
        if self.pending >= self.queue_limit:
            raise APIError("rate_limit", "the proxy is at its concurrent-call limit; retry shortly", retry_after=1.0)
        self.pending += 1
        try:
            await asyncio.wait_for(self._free.acquire(), self.wait_s)
        except TimeoutError:
            self.pending -= 1
            raise APIError("rate_limit", "waited too long for a free call slot; retry", retry_after=1.0) from None
        except BaseException:
            self.pending -= 1
            raise
        return Slot(self)

    def _give_back(self) -> None:
        self.pending -= 1
        self._free.release()
