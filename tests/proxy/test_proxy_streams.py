"""`EventStream` (proxy/pipeline.py), the proxy's streaming response without an anyio task group:
the client leaving stops the body (its `finally` runs) and the response ends quietly; the server
stopping (the request's task cancelled from outside) is not mistaken for the client leaving; a body
that ends is written whole, in the order given."""

from __future__ import annotations

import asyncio

import pytest

from openforge.proxy.pipeline import EventStream


def _body(log: list[str], forever: asyncio.Event):
    async def gen():
        try:
            yield "data: 1\n\n"
            await forever.wait()  # an engine that has not answered yet
            yield "data: never\n\n"
        finally:
            log.append("body closed")
    return gen()


async def test_the_client_leaving_stops_the_body_and_ends_the_response():
    log: list[str] = []
    sent: list[dict] = []
    left = asyncio.Event()

    async def receive() -> dict:
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)
        if message.get("body") == b"data: 1\n\n":
            left.set()  # the client goes away once it has the first chunk

    async def serve() -> int:
        await EventStream(_body(log, asyncio.Event()))({"type": "http"}, receive, send)
        return asyncio.current_task().cancelling()

    # The cancellation it used to stop the body is not left pending on the request's task.
    assert await asyncio.wait_for(serve(), 30) == 0
    assert log == ["body closed"]
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]


async def test_the_server_stopping_is_not_taken_for_the_client_leaving():
    log: list[str] = []
    started = asyncio.Event()

    async def receive() -> dict:
        await asyncio.Event().wait()  # the client stays
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.body":
            started.set()

    task = asyncio.ensure_future(EventStream(_body(log, asyncio.Event()))({"type": "http"}, receive, send))
    await asyncio.wait_for(started.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log == ["body closed"]


async def test_a_finished_body_is_written_whole_and_in_order():
    sent: list[bytes] = []

    async def receive() -> dict:
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.body":
            sent.append(message["body"])

    async def gen():
        for i in range(5):
            yield f"data: {i}\n\n"

    await asyncio.wait_for(EventStream(gen())({"type": "http"}, receive, send), 30)
    assert sent == [f"data: {i}\n\n".encode() for i in range(5)] + [b""]
