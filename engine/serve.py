"""Serve any ASGI app on uvicorn in a background thread, on loopback and a free port.

Tests of every part use it to put a real server (the proxy, the embedded or scripted engine, an API
double) on 127.0.0.1 without a subprocess:

    with serve_in_thread(app) as server:
        httpx.get(server.url + "/health")
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import threading
import time
from dataclasses import dataclass
from typing import Any

import asyncio
import logging

import uvicorn

from openforge.errors import EngineError

# How long our servers (the proxy, the embedded engine, the router's front) keep an idle HTTP/1.1
# connection open. uvicorn's default, 5 s, equals httpx's (so the OpenAI and Anthropic Python SDKs')
# keep-alive expiry: a client reusing a connection idle for ~5 s races the server's close and gets a
# connection error with no response (~1 call in 6 at /health in a probe that slept just past 5 s).
# The server must outlast every client's expiry instead: httpx 5 s, Node's agents 4-5 s, aiohttp
# 15 s, Go's net/http and Rust's hyper/reqwest 90 s (nginx keeps 75 s, AWS ALB 60 s). An idle
# connection costs a few KB; urllib3 keeps its own forever but checks it before each reuse.
KEEP_ALIVE_S = 120


class _ShutdownCancellations(logging.Filter):
    """uvicorn logs a request still running when its graceful-shutdown timeout ends as "Exception in
    ASGI application" with the CancelledError's traceback. That is a stop, not a bug: say it in one line
    (a proxy call's row stays in flight until recovery marks it `interrupted`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, asyncio.CancelledError):
            record.msg, record.args, record.exc_info, record.exc_text = (
                "a request in progress was cancelled as the server stopped", None, None, None)
        return True


def quiet_shutdown_cancellations() -> None:
    """Install the filter above on uvicorn's error logger (idempotent)."""
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _ShutdownCancellations) for f in logger.filters):
        logger.addFilter(_ShutdownCancellations())


@dataclass
class ServerHandle:
    """A running server: its base URL, and `stop()` (also on leaving a `with` block)."""

    url: str
    host: str
    port: int
    server: uvicorn.Server
    thread: threading.Thread
    uds: str | None = None  # the unix socket it also serves on, if any

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        if self.thread.is_alive():  # a handler that never returns: stop waiting for it
            self.server.force_exit = True
            self.thread.join(timeout)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def listen_unix(path: str) -> socket.socket:
    """A listening unix socket at `path` (a stale socket file left by a dead server is replaced)."""
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        # Open to every local user, like a loopback port: whoever connects still needs a credential,
        # and a sandbox may run under another uid than the server.
        os.chmod(path, 0o666)
    except OSError as exc:
        sock.close()
        raise EngineError(f"cannot listen on unix socket {path}: {exc.strerror or exc}") from None
    sock.listen(2048)
    return sock


def listen_tcp(host: str, port: int, *, error: type[Exception] = EngineError) -> socket.socket:
    """A bound, listening TCP socket (port 0 = a free one), or `error` naming why not.

    proto=IPPROTO_TCP, not the default 0: asyncio only sets TCP_NODELAY on accepted sockets whose
    proto says TCP; without it Nagle + delayed ACK add ~40 ms to every small response."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise error(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(2048)
    return sock


def serve_in_thread(app: Any, host: str = "127.0.0.1", port: int = 0, *, log_level: str = "warning",
                    startup_timeout: float = 30.0, uds: str | None = None, **options: Any) -> ServerHandle:
    """Start `app` on uvicorn in a daemon thread and return once it accepts connections.

    The socket is bound here, before the thread starts, so `port=0` yields the real port at once and
    two servers can never race for the same one. With `uds`, the same app also serves on a unix socket
    at that path (removed again on stop). `options` go to `uvicorn.Config` (e.g. `http=`); idle
    connections are kept KEEP_ALIVE_S unless `timeout_keep_alive` says otherwise."""
    sock = listen_tcp(host, port)
    real_port = sock.getsockname()[1]
    sockets = [sock]
    if uds is not None:
        try:
            sockets.append(listen_unix(uds))
        except EngineError:
            sock.close()
            raise
    options.setdefault("timeout_keep_alive", KEEP_ALIVE_S)
    config = uvicorn.Config(app, log_level=log_level, access_log=False, timeout_graceful_shutdown=2, **options)
    server = uvicorn.Server(config)
    quiet_shutdown_cancellations()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            server.run(sockets=sockets)
        except BaseException as exc:  # noqa: BLE001 - reported to the starting thread below
            errors.append(exc)
        finally:
            for s in sockets:
                s.close()
            if uds is not None:
                with contextlib.suppress(OSError):
                    os.unlink(uds)

    thread = threading.Thread(target=run, name=f"uvicorn-{real_port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if errors or not thread.is_alive():
            raise EngineError(f"server on {host}:{real_port} failed to start: {errors[0] if errors else 'exited'}")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise EngineError(f"server on {host}:{real_port} did not start within {startup_timeout:g}s")
        time.sleep(0.01)
    shown = f"[{host}]" if ":" in host else host
    return ServerHandle(url=f"http://{shown}:{real_port}", host=host, port=real_port, server=server, thread=thread,
                        uds=uds)
