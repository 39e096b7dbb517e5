"""The host side of a GUI task's site for sandboxes on other machines (Kubernetes pods): one TCP
listener per process that hands each connection to the site of the rollout whose token it presents.

    relay = acquire_relay("10.0.0.5", 0)          # lazily started, shared by every pod of the process
    token = relay.register("/tmp/forge-site-x/site.sock")
    ... a pod connects to 10.0.0.5:relay.port, sends site_preamble(token), then speaks HTTP ...
    relay.unregister(token); release_relay(relay)  # live connections of that token are closed too

A site is a unix socket on the host (rollouts/tasks/web/server.py), which a pod on another node cannot have
bound in. In the pod, sandbox/forwarder.py (`--connect HOST:PORT --token T`) listens on 127.0.0.1:8080
and opens one relay connection per client connection, writing the fixed-size preamble first.

The token is the only key: 256 random bits, one per attached rollout, held by the host and by that
rollout's pod only. A connection whose first PREAMBLE_LEN bytes are not `FORGE-SITE <a registered
token>\n` (or that does not send them within PREAMBLE_TIMEOUT_S) is closed without a byte written, so
a pod that knows its own token reaches its own site and nothing else; after that the connection is a
raw byte pipe to that one socket. Unregistering (detach, stop) closes the token's open connections:
nothing in the pod can change the site's state after the runner detached it, before grading.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import socket
import threading
from dataclasses import dataclass, field

from openforge.errors import SandboxError
from openforge.sandbox.forwarder import SITE_PREAMBLE_LEN, pipe, site_preamble

PREAMBLE_LEN = SITE_PREAMBLE_LEN
PREAMBLE_TIMEOUT_S = 10.0
# Connections still owing their preamble, per peer address (a pod) and in all; past either, new ones
# are closed at once. Per peer, so one pod holding connections open cannot starve the others.
MAX_UNIDENTIFIED_PER_PEER = 32
MAX_UNIDENTIFIED = 1024
MAX_PER_TOKEN = 64  # open connections to one site (a browser uses ~6): each costs the site a thread


def _key(token: str) -> bytes:
    # Tokens are looked up by their hash: the dict never holds (or compares) the secret itself.
    return hashlib.sha256(token.encode("ascii", "replace")).digest()


@dataclass
class _Route:
    socket_path: str
    writers: set[asyncio.StreamWriter] = field(default_factory=set)


class SiteRelay:
    """One listener (a thread with its own event loop); `port` is the bound port."""

    def __init__(self, host: str, port: int = 0) -> None:
        self.host = host
        self._routes: dict[bytes, _Route] = {}
        self._lock = threading.Lock()
        self.users = 0
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            family, _, _, _, addr = infos[0]
            listener = socket.socket(family, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(addr)
            listener.listen(256)
        except OSError as exc:
            raise SandboxError(f"cannot listen for the GUI site relay on {host}:{port}: {exc.strerror or exc} "
                               "(set sandbox.site_relay_host to an address of this machine that pods reach, "
                               "e.g. 0.0.0.0 in a controller pod, and sandbox.site_relay_port)") from None
        listener.setblocking(False)
        self.port: int = listener.getsockname()[1]
        self._listener = listener
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stopping: asyncio.Event | None = None
        self._clients: set[asyncio.StreamWriter] = set()  # every open client connection (the loop's thread)
        self._unidentified: dict[str, int] = {}  # peer address -> connections owing their preamble
        self._thread = threading.Thread(target=self._run, name=f"site-relay-{self.port}", daemon=True)
        self._thread.start()
        self._ready.wait(30)

    # -- the registry (any thread) -----------------------------------------------------------------
    def register(self, socket_path: str) -> str:
        """A new token that reaches `socket_path` until unregistered."""
        token = secrets.token_hex(32)
        with self._lock:
            self._routes[_key(token)] = _Route(str(socket_path))
        return token

    def unregister(self, token: str) -> None:
        """Forget the token and close its open connections (no-op for an unknown token)."""
        with self._lock:
            route = self._routes.pop(_key(token), None)
        if route is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._close_all, route)
            except RuntimeError:  # the loop stopped meanwhile: its connections went with it
                pass

    @property
    def registered(self) -> int:
        with self._lock:
            return len(self._routes)

    def _route(self, token: str) -> _Route | None:
        with self._lock:
            return self._routes.get(_key(token))

    # -- the server (its own thread) ---------------------------------------------------------------
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        server = await asyncio.start_server(self._handle, sock=self._listener)
        self._ready.set()
        await self._stopping.wait()
        server.close()
        with self._lock:
            routes = list(self._routes.values())
        for route in routes:
            self._close_all(route)
        for writer in list(self._clients):
            _abort(writer)
        # Aborted connections end their handlers; cancelling one instead makes asyncio log it (3.11).
        handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if handlers:
            await asyncio.wait(handlers, timeout=5)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = str((writer.get_extra_info("peername") or ("?",))[0])
        if (self._unidentified.get(peer, 0) >= MAX_UNIDENTIFIED_PER_PEER
                or sum(self._unidentified.values()) >= MAX_UNIDENTIFIED):
            _abort(writer)
            return
        self._clients.add(writer)
        try:
            await self._relay(reader, writer, peer)
        finally:
            self._clients.discard(writer)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str) -> None:
        route, token = None, None
        self._unidentified[peer] = self._unidentified.get(peer, 0) + 1
        try:
            head = await asyncio.wait_for(reader.readexactly(PREAMBLE_LEN), PREAMBLE_TIMEOUT_S)
            token = _token_of(head)
            route = self._route(token) if token else None
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError, OSError):
            route = None
        finally:
            self._unidentified[peer] -= 1
            if not self._unidentified[peer]:
                del self._unidentified[peer]
        # Unknown, malformed or missing token, or too many open to that site: nothing is written back.
        if route is None or token is None or len(route.writers) >= 2 * MAX_PER_TOKEN:
            _abort(writer)
            return
        try:
            site_r, site_w = await asyncio.open_unix_connection(route.socket_path)
        except OSError:
            _abort(writer)
            return
        route.writers.update((writer, site_w))
        if self._route(token) is not route:  # unregistered while connecting
            self._close_all(route)
            return
        try:
            await asyncio.gather(pipe(reader, site_w), pipe(site_r, writer))
        finally:
            route.writers.discard(writer)
            route.writers.discard(site_w)
            writer.close()
            site_w.close()

    @staticmethod
    def _close_all(route: _Route) -> None:
        for w in list(route.writers):
            _abort(w)
        route.writers.clear()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._loop.call_soon_threadsafe(lambda: self._stopping and self._stopping.set())
        except RuntimeError:
            return
        self._thread.join(10)


def _token_of(head: bytes) -> str | None:
    """The token in a preamble, or None if it is not one (same format as `site_preamble`)."""
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError:
        return None
    token = text.removeprefix("FORGE-SITE ").removesuffix("\n")
    if len(token) != 64 or any(c not in "0123456789abcdef" for c in token) or site_preamble(token) != head:
        return None
    return token


def _abort(writer: asyncio.StreamWriter) -> None:
    transport = writer.transport
    if transport is not None and not transport.is_closing():
        transport.abort()


# -- one relay per (address, port) in this process, shared by every sandbox that uses it -----------
_relays: dict[tuple[str, int], SiteRelay] = {}
_relays_lock = threading.Lock()


def acquire_relay(host: str, port: int = 0) -> SiteRelay:
    """The process's relay on host:port (port 0: the one already running on host, else a new ephemeral
    one), started on first use; pair each call with `release_relay`."""
    with _relays_lock:
        relay = _relays.get((host, port))
        if relay is None:
            relay = SiteRelay(host, port)
            _relays[(host, port)] = relay
        relay.users += 1
        return relay


def release_relay(relay: SiteRelay) -> None:
    """Drop one use; the last one closes the listener."""
    with _relays_lock:
        relay.users -= 1
        if relay.users > 0:
            return
        for key, value in list(_relays.items()):
            if value is relay:
                del _relays[key]
    relay.close()


__all__ = ["PREAMBLE_LEN", "SiteRelay", "acquire_relay", "release_relay", "site_preamble"]
