"""trainer/cancel.py: the run's controller cancels sampling from another thread: the step in flight (its task,
so the runner's own cleanup runs) and every later one."""

from __future__ import annotations

import asyncio
import threading

import pytest

from openforge.trainer.cancel import Cancelled, CancelToken


async def test_a_cancel_from_another_thread_ends_the_step_in_flight_after_its_cleanup() -> None:
    token, cleaned = CancelToken(), []

    async def step() -> str:
        try:
            await asyncio.sleep(30)
            return "sampled"
        finally:
            cleaned.append("sandbox stopped")

    started = asyncio.get_running_loop().time()
    threading.Timer(0.1, token.cancel).start()
    with pytest.raises(asyncio.CancelledError):
        await token.guard(step())
    assert cleaned == ["sandbox stopped"] and asyncio.get_running_loop().time() - started < 5
    assert token.cancelled
    with pytest.raises(Cancelled):  # the trainer's check between steps: a KeyboardInterrupt, so the run is stopped
        token.check()


async def test_after_a_cancel_no_later_step_starts_and_before_one_steps_run_through() -> None:
    token = CancelToken()
    assert await token.guard(asyncio.sleep(0, result=7)) == 7
    token.check()  # not cancelled: nothing raised
    token.cancel()
    ran = []

    async def later() -> None:
        ran.append("later")

    work = later()
    with pytest.raises(asyncio.CancelledError):
        await token.guard(work)
    assert ran == [] and work.cr_frame is None  # closed, never run (no "never awaited" warning)
    assert issubclass(Cancelled, KeyboardInterrupt)
