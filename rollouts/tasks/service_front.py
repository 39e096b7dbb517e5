"""A task service's recording front: the only way in to the service, run in forge's own process.

    front = RecordingFront("mail", 0.25, backend, seed, record, lock, socket_path)
    front.port          # 127.0.0.1:port, for the host's callers (the MCP tool server)
    front.socket_path   # a unix socket, bound into an isolated sandbox
    front.close()

Every request it passes on, or answers itself with an injected error, is appended to `record` as a
`ServiceRequest` (rollouts/tasks/services.py grades that record). Which POSTs get an error is
`injected_status(seed, service, n, error_rate)`: deterministic, so a test can name them.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import socket
import socketserver
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

MAX_BODY = 1024 * 1024  # a tool call's JSON body; a larger one is refused (413) and recorded as such
MAX_CONNECTIONS = 32  # per front and listener, at once
TOOL_HEADER = "X-Forge-Tool"  # set by the MCP tool server: which task tool a request carries out
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, port: int, timeout: float) -> None:
        # Host: the service's own address as it listens (an MCP server refuses any other: DNS rebinding).
        super().__init__("127.0.0.1", port, timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


Backend = int | tuple[str, int]  # the service's port on the host's loopback, or (unix socket, its port inside)


def backend_connection(backend: Backend, timeout: float) -> http.client.HTTPConnection:
    """A connection to the service itself: its port on the host's loopback (unconfined), or the unix socket
    into the network of the sandbox it runs in (sandbox/confine.py)."""
    if isinstance(backend, int):
        return http.client.HTTPConnection("127.0.0.1", backend, timeout=timeout)
    return _UnixConnection(backend[0], backend[1], timeout)


@dataclass(frozen=True)
class ServiceRequest:
    """One request a service's front received, as forge saw it."""

    service: str
    method: str
    path: str
    query: str
    body: str
    status: int
    injected: bool
    tool: str | None = None

    def json_body(self) -> Any:
        try:
            return json.loads(self.body) if self.body else None
        except ValueError:
            return None


def injected_status(seed: str, service: str, index: int, rate: float) -> int | None:
    """The error the front answers request `index` (0-based, POSTs of `service` counted) with, or None."""
    if rate <= 0:
        return None
    rng = random.Random(f"{seed}/{service}/{index}")
    return (429 if rng.random() < 0.5 else 500) if rng.random() < rate else None


_INJECTED_BODY = {
    429: {"error": "rate_limit_exceeded", "message": "Too many requests. Please retry after a short delay.",
          "retry_after_seconds": 2},
    500: {"error": "internal_server_error", "message": "An unexpected error occurred. Please try again."},
}


class _Bounded:
    """At most MAX_CONNECTIONS at once (more are closed unanswered): a sandbox opening connections
    without end must not get a thread of the runner's process each (as rollouts/tasks/web/server.py)."""

    daemon_threads = True

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)  # type: ignore[call-arg]
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)  # type: ignore[attr-defined]
            return
        try:
            super().process_request(request, client_address)  # type: ignore[misc]
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)  # type: ignore[misc]
        finally:
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client's broken connection is not the runner's error


class _TCPServer(_Bounded, ThreadingHTTPServer):
    pass


class _UnixHTTPServer(_Bounded, socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    pass


class RecordingFront:
    """The recording front of one service: one threaded HTTP server on an ephemeral 127.0.0.1 port (the
    host's callers: the MCP tool server, a sandbox sharing the host's network) and one on a unix socket
    in the session's 0700 folder (bound into an isolated sandbox, as a GUI task's site is)."""

    def __init__(self, name: str, error_rate: float, backend: Backend, seed: str, record: list[ServiceRequest],
                 lock: threading.Lock, socket_path: str) -> None:
        self.name, self.error_rate, self.backend, self.seed = name, error_rate, backend, seed
        self.record, self.lock = record, lock
        self.posts = 0
        self.server = _TCPServer(("127.0.0.1", 0), self._handler(tool_header=True))
        self.port = self.server.server_address[1]
        self.socket_path = socket_path
        # The socket is the isolated sandbox's way in: a tool name it claims is not the MCP server's word.
        self.unix = _UnixHTTPServer(socket_path, self._handler(tool_header=False))
        os.chmod(socket_path, 0o666)  # the sandbox's user is a mapped uid: it must be able to connect
        for server, kind in ((self.server, "tcp"), (self.unix, "unix")):
            # A short poll: shutdown() waits for it, and each rollout closes two fronts a service.
            threading.Thread(target=server.serve_forever, args=(0.05,), name=f"service-{name}-{kind}",
                             daemon=True).start()

    def _handler(self, *, tool_header: bool) -> type[BaseHTTPRequestHandler]:
        front = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 60

            def log_message(self, *args: Any) -> None:
                pass

            def address_string(self) -> str:  # a unix socket's peer has no address
                return "sandbox"

            def _serve(self) -> None:
                front.serve(self, self.headers.get(TOOL_HEADER) if tool_header else None)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

        return Handler

    def serve(self, h: BaseHTTPRequestHandler, tool: str | None) -> None:
        parts = urlsplit(h.path)
        try:
            length = int(h.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            h.close_connection = True
            self._note(h, parts, "", 413, False, tool)
            return self._reply(h, 413, b'{"error": "body too large"}', "application/json")
        body = h.rfile.read(length) if length else b""
        text = body.decode("utf-8", "replace")
        injected = None
        with self.lock:  # the index and the record in one step: the order the record shows is the order used
            if h.command == "POST":
                injected = injected_status(self.seed, self.name, self.posts, self.error_rate)
                self.posts += 1
            if injected is not None:
                self._note(h, parts, text, injected, True, tool)
        if injected is not None:
            data = json.dumps(_INJECTED_BODY[injected]).encode()
            return self._reply(h, injected, data, "application/json", {"Retry-After": "2"} if injected == 429 else {})
        headers = {k: v for k, v in h.headers.items() if k.lower() not in _HOP_HEADERS}
        conn = backend_connection(self.backend, 60)
        try:
            conn.request(h.command, h.path, body=body, headers=headers)
            resp = conn.getresponse()
            data, status = resp.read(), resp.status
            ctype = resp.getheader("Content-Type", "application/octet-stream")
            # The service's own headers go back too (an MCP server's Mcp-Session-Id names the session).
            passed = {k: v for k, v in resp.getheaders()
                      if k.lower() not in _HOP_HEADERS | {"content-type", "date", "server"}}
        except (OSError, http.client.HTTPException) as exc:
            data, status, ctype = json.dumps({"error": f"service unreachable: {exc}"}).encode(), 502, "application/json"
            passed = {}
        finally:
            conn.close()
        with self.lock:
            self._note(h, parts, text, status, False, tool)
        self._reply(h, status, data, ctype, passed)

    def _note(self, h: BaseHTTPRequestHandler, parts: Any, body: str, status: int, injected: bool,
              tool: str | None) -> None:
        self.record.append(ServiceRequest(service=self.name, method=h.command, path=parts.path,
                                          query=parts.query, body=body, status=status, injected=injected,
                                          tool=tool))

    @staticmethod
    def _reply(h: BaseHTTPRequestHandler, status: int, data: bytes, ctype: str,
               extra: dict[str, str] | None = None) -> None:
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(data)))
        for k, v in (extra or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)

    def close(self) -> None:
        for server in (self.server, self.unix):
            server.shutdown()
            server.server_close()
