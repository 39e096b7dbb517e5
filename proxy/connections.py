"""The proxy's HTTP connections: uvicorn's h11 protocol with a deadline on reading each request.

uvicorn bounds only the idle time *between* requests (`timeout_keep_alive`), and any byte received
cancels that timer. A client that opens a connection and trickles a header byte every few seconds
(slow loris) therefore holds a connection, and the memory of its buffer, forever; so does one that
sends its headers and then dribbles the body. Here each request must arrive whole - headers and
body - within `read_timeout_s` of the moment the server started waiting for it, or the connection
is closed. Writing the response is not bounded: a streamed completion may take minutes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("forge.proxy")
_READING = (h11.IDLE, h11.SEND_BODY)  # the client's states while a request is still arriving


class DeadlineH11Protocol(H11Protocol):
    """H11Protocol that closes a connection whose request takes longer than `read_timeout_s` to arrive."""

    read_timeout_s: float = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state not in _READING:  # the request is in (or the connection is done)
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm()  # waiting for the next request on this connection

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._read_deadline = self.loop.call_later(self.read_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _expired(self) -> None:
        self._read_deadline = None
        if self.transport.is_closing() or self.conn.their_state not in _READING:
            return
        if self.conn.their_state is h11.SEND_BODY or self.conn.trailing_data[0]:  # a request had begun
            log.warning("proxy: closed a connection from %s whose request did not arrive within %gs",
                        _peer(self.client), self.read_timeout_s)
        self.transport.close()  # the app, if it was reading the body, sees the client disconnect


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "a unix socket"


def deadline_protocol(read_timeout_s: float) -> type[DeadlineH11Protocol]:
    """The protocol class to give `uvicorn.Config(http=...)` for this deadline."""
    return type("DeadlineH11Protocol", (DeadlineH11Protocol,), {"read_timeout_s": read_timeout_s})
