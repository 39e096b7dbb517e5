"""proxy/connections.py on a bare uvicorn server: a request that trickles in is cut at its deadline (slow
loris), one that arrives whole is answered however long the app takes."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from openforge.ports import free_port
from openforge.proxy.connections import DeadlineHttpToolsProtocol, deadline_protocol


async def _app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    if scope["type"] != "http":
        return
    await asyncio.sleep(0.8)  # longer than the read deadline: answering is not bounded
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def port() -> Iterator[int]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(_app, host="127.0.0.1", port=port, http=deadline_protocol(0.5),
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    yield port
    server.should_exit = True
    thread.join(5)


def test_the_protocol_class_carries_its_deadline() -> None:
    cls = deadline_protocol(2.5)
    assert issubclass(cls, DeadlineHttpToolsProtocol) and cls.read_timeout_s == 2.5
    assert DeadlineHttpToolsProtocol.read_timeout_s == 30.0  # the base class is untouched


def test_a_trickled_request_is_closed_and_a_whole_one_answered(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as slow:
        slow.settimeout(3)
        start = time.monotonic()
        slow.sendall(b"GET / HTTP/1.1\r\n")
        time.sleep(0.3)
        slow.sendall(b"Host: x\r\n")  # a byte now and then does not extend the deadline
        assert slow.recv(100) == b""  # closed by the server
        assert 0.4 < time.monotonic() - start < 2.5
    with socket.create_connection(("127.0.0.1", port)) as fast:
        fast.settimeout(5)
        fast.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = b""
        while not reply.endswith(b"ok"):
            chunk = fast.recv(1000)
            assert chunk, reply
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 200")
