"""Cancelling sampling from another thread (the run's controller) while the trainer waits on it."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


class Cancelled(KeyboardInterrupt):
    """Sampling was cancelled: the run is stopping. A KeyboardInterrupt, so that `train()` records the
    run as `stopped` rather than `failed`."""


class CancelToken:
    """Cancels sampling from any thread: the step in flight (its asyncio task, so the runner's own
    cleanup - sandbox `stop()` in its `finally` blocks - runs before the sampler returns) and every
    later one."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._running: set[tuple[asyncio.AbstractEventLoop, asyncio.Task]] = set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self) -> None:
        with self._lock:
            self._event.set()
            running = list(self._running)
        for loop, task in running:
            loop.call_soon_threadsafe(task.cancel)

    def check(self) -> None:
        if self._event.is_set():
            raise Cancelled()

    async def guard(self, work: Awaitable[T]) -> T:
        """Await `work` as a task this token cancels."""
        task = asyncio.current_task()
        assert task is not None
        entry = (asyncio.get_running_loop(), task)
        with self._lock:
            if self._event.is_set():  # cancelled before this task existed to be cancelled
                if inspect.iscoroutine(work):
                    work.close()
                raise asyncio.CancelledError
            self._running.add(entry)
        try:
            return await work
        finally:
            with self._lock:
                self._running.discard(entry)
