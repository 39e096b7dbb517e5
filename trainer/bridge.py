"""The thread bridge between the synchronous training loop and the async engine client.

The engine client is async and its HTTP pool belongs to one event loop, while the training loop is
plain synchronous PyTorch; `BackgroundLoop` runs one event loop in a thread for all of them.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class BackgroundLoop:
    """One asyncio loop in a daemon thread; `run(coro)` blocks the caller until it is done."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="forge-trainer-io", daemon=True)
        self._thread.start()

    def submit(self, value: Awaitable[T] | T) -> Future:
        if not inspect.isawaitable(value):
            done: Future = Future()
            done.set_result(value)
            return done
        async def wrap() -> Any:
            return await value
        return asyncio.run_coroutine_threadsafe(wrap(), self.loop)

    def run(self, value: Awaitable[T] | T) -> T:
        return self.submit(value).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
