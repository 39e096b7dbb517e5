"""The proxy's HTTP connections: uvicorn's httptools protocol with a deadline on reading each request.

httptools (llhttp, the parser in C that Node uses) rather than h11: parsing a request and writing a
response costs a fraction of h11's pure-Python state machine, which was a fifth of the proxy's CPU
per call.

uvicorn bounds only the idle time *between* requests (`timeout_keep_alive`), and any byte received
cancels that timer. A client that opens a connection and trickles a header byte every few seconds
(slow loris) therefore holds a connection, and the memory of its buffer, forever; so does one that
sends its headers and then dribbles the body. Here a connection's first request must arrive whole -
headers and body - within `read_timeout_s` of the connection, and each later one within
`read_timeout_s` of its first byte, or the connection is closed. Between requests a kept-alive
connection may idle for `timeout_keep_alive` (engine.serve.KEEP_ALIVE_S), counted from the last
response and not restarted by stray bytes: closing it sooner would race clients that reuse a
connection idle for a while (the OpenAI SDK's, after 5 s). Writing the response is not bounded: a
streamed completion may take minutes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("forge.proxy")


class DeadlineHttpToolsProtocol(HttpToolsProtocol):
    """HttpToolsProtocol that closes a connection whose request takes longer than `read_timeout_s` to arrive."""

    read_timeout_s: float = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_deadline: asyncio.TimerHandle | None = None
        self._in_message = False  # a request's first byte is in, its last one not yet
        self._unanswered = 0  # requests fully read whose responses are not complete (pipelining: > 1)
        self._kept_alive = False  # idle after a response: the deadline is the keep-alive one

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.read_timeout_s)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_message = True
        if self._kept_alive:  # the next request has begun: it has read_timeout_s to arrive whole
            self._arm(self.read_timeout_s)

    def on_message_complete(self) -> None:
        self._in_message = False
        self._unanswered += 1
        self._disarm()  # the request is in: the app's time is not bounded here
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self._unanswered = max(0, self._unanswered - 1)
        super().on_response_complete()
        if not self.transport.is_closing() and self._unanswered == 0:
            if self._in_message:  # a pipelined request is already arriving: its deadline holds
                self._arm(self.read_timeout_s)
            else:
                self._arm(self.timeout_keep_alive)
                self._kept_alive = True

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._kept_alive = False
        self._read_deadline = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _expired(self) -> None:
        self._read_deadline = None
        if self.transport.is_closing() or self._unanswered:
            return
        if self._in_message:  # a request had begun (an idle kept-alive connection closes quietly)
            log.warning("proxy: closed a connection from %s whose request did not arrive within %gs",
                        _peer(self.client), self.read_timeout_s)
        self.transport.close()  # the app, if it was reading the body, sees the client disconnect


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "a unix socket"


def deadline_protocol(read_timeout_s: float) -> type[DeadlineHttpToolsProtocol]:
    """The protocol class to give `uvicorn.Config(http=...)` for this deadline."""
    return type("DeadlineHttpToolsProtocol", (DeadlineHttpToolsProtocol,), {"read_timeout_s": read_timeout_s})
