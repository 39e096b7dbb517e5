"""A task site served on the host, one per rollout, on a unix socket the sandbox gets bound in.

    async with SiteSession(gui) as site:           # the server thread, its private socket folder
        sandbox.attach_gui(site.gui_spec())         # execs see it at http://127.0.0.1:8080/
        ...                                         # the agent runs
        ok, line = site.grade()                     # the site's state against gui.expect_state

The socket lives in a fresh 0700 folder outside every sandbox folder; only the socket itself is bound
into the sandbox (at /run/forge/site.sock, served on the sandbox's 127.0.0.1:8080 by sandbox/forwarder.py).
The state is the server's Python objects: nothing in the sandbox can read or write it except through
the site's HTTP actions, and the grader reads it here, on the host.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socketserver
import tempfile
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from openforge.rollouts.tasks.web.sites import Site, make_site
from openforge.rollouts.tasks.web.spec import GuiTask
from openforge.sandbox.gui import SITE_URL, GuiSpec

MAX_BODY = 64 * 1024
# Each connection is a thread of the runner's process, so a sandbox opening connections without end
# (or holding them idle) must not get a thread each, for ever: at most MAX_CONNECTIONS at once (more are
# closed unanswered) and IDLE_TIMEOUT_S of silence ends one. A browser keeps about six to a site.
MAX_CONNECTIONS = 32
IDLE_TIMEOUT_S = 30.0


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True  # never joined: close() does not wait on a connection held open

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client's broken connection is not the runner's error: no traceback on its stderr


def _handler(site: Site, lock: threading.Lock) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = IDLE_TIMEOUT_S

        def log_message(self, *args: Any) -> None:
            pass

        def address_string(self) -> str:  # a unix socket's peer has no address
            return "sandbox"

        def _serve(self, method: str) -> None:
            parts = urlsplit(self.path)
            form: dict[str, str] = {}
            if method == "POST":
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    length = -1
                if not 0 <= length <= MAX_BODY:  # the body is left unread: this connection ends here
                    self.close_connection = True
                    self._reply(413 if length > MAX_BODY else 400, "text/plain",
                                "too large" if length > MAX_BODY else "bad Content-Length")
                    return
                form = dict(parse_qsl(self.rfile.read(length).decode("utf-8", "replace")))
            with lock:  # one request at a time changes the state
                status, ctype, body = site.handle(method, parts.path, form)
            self._reply(status, ctype, body)

        def _reply(self, status: int, ctype: str, body: str) -> None:
            data = b"" if status == 303 else body.encode("utf-8")
            self.send_response(status)
            if status == 303:
                self.send_header("Location", body)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

    return Handler


class SiteSession:
    """One rollout's site: its server thread, its socket, its state and its grading."""

    def __init__(self, gui: GuiTask) -> None:
        self.gui = gui
        self.site = make_site(gui.site, gui.params)
        self._lock = threading.Lock()
        self.folder = tempfile.mkdtemp(prefix="forge-site-")  # mkdtemp: 0700, ours only
        self.socket_path = os.path.join(self.folder, "site.sock")
        self.server = _UnixHTTPServer(self.socket_path, _handler(self.site, self._lock))
        os.chmod(self.socket_path, 0o666)  # the sandbox's user is a mapped uid: it must be able to connect
        self._thread = threading.Thread(target=self.server.serve_forever, name=f"site-{gui.site}", daemon=True)
        self._thread.start()

    def gui_spec(self) -> GuiSpec:
        return GuiSpec(url=SITE_URL.rstrip("/") + self.gui.path, mode=self.gui.mode, site_socket=self.socket_path)

    def state(self) -> dict[str, Any]:
        with self._lock:
            return json.loads(json.dumps(self.site.state()))

    def grade(self) -> tuple[bool, str]:
        """(every expected key equals the state's, one line for the verifier output)."""
        state = self.state()
        wrong = {k: state.get(k) for k, v in self.gui.expect_state.items() if state.get(k) != v}
        if not wrong:
            return True, f"site state: ok: {json.dumps(self.gui.expect_state, sort_keys=True)}"
        return False, (f"site state: wrong: expected {json.dumps(self.gui.expect_state, sort_keys=True)[:300]}, "
                       f"got {json.dumps(wrong, sort_keys=True)[:300]}")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        shutil.rmtree(self.folder, ignore_errors=True)

    async def __aenter__(self) -> "SiteSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await asyncio.to_thread(self.close)
