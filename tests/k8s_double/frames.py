"""An exec endpoint that sends frames the way the apiserver's stream translator does, for the exec
client's byte-exactness tests: the handshake of `v5.channel.k8s.io`/`v4`, an empty stdout frame first,
then stdout and stderr frames interleaved as two concurrent copiers produce them (one frame per read,
at most 32 KiB each), written back to back so many frames share one TCP read, the status on channel
3, and the close. Which frames it sends is the test's choice (`script`), so the bytes out are known.

It runs in a process of its own (forked), as the apiserver does: in a thread of the test's process
the GIL would serialise server and client, and frames would never arrive while the client reads
(the timing under which the client's `read_all()` dropped frames).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import time
from collections.abc import Callable, Iterable

from aiohttp import web

PAUSE_S = 0.00005  # frames trickling in: some arrive while the client is between two reads
SUCCESS = json.dumps({"metadata": {}, "status": "Success"}).encode()


class FrameEndpoint:
    """`script(query) -> iterable of (channel, bytes) or None (a short pause)`; the frames are sent in
    order, then `status`."""

    def __init__(self, script: Callable[[dict], Iterable[tuple[int, bytes] | None]], *, status: bytes = SUCCESS,
                 protocols: tuple[str, ...] = ("v5.channel.k8s.io", "v4.channel.k8s.io")) -> None:
        self.script, self.status, self.protocols = script, status, protocols
        self.url = ""

    def __enter__(self) -> "FrameEndpoint":
        ctx = multiprocessing.get_context("fork")
        self._urls, self._frames = ctx.Queue(), ctx.Queue()
        self._proc = ctx.Process(target=self._serve, daemon=True, name="frame-endpoint")
        self._proc.start()
        self.url = self._urls.get(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._proc.terminate()
        self._proc.join(10)

    def next_received(self, timeout: float = 5) -> bytes:
        """The next frame the client sent (stdin, a CLOSE signal), in order."""
        return self._frames.get(timeout=timeout)

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)

        async def boot() -> None:
            app = web.Application()
            app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}/exec", self._exec)
            runner = web.AppRunner(app, handle_signals=False)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0, shutdown_timeout=0.5)
            await site.start()
            self._urls.put(f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}")  # type: ignore[union-attr]

        loop.run_until_complete(boot())
        loop.run_forever()

    async def _exec(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(protocols=self.protocols, compress=False, max_msg_size=0)
        await ws.prepare(request)
        stdin_closed = asyncio.Event()
        reader = asyncio.ensure_future(self._read(ws, stdin_closed))
        await ws.send_bytes(b"\x01")
        if request.query.get("stdin") == "true":  # a command that reads its input first
            try:
                await asyncio.wait_for(stdin_closed.wait(), 0.5)  # v4 has no CLOSE: wait a moment
            except TimeoutError:
                pass
        for frame in self.script(dict(request.query)):
            if frame is None:  # a pause: the process has not written more yet (own process: may block)
                time.sleep(PAUSE_S)
                continue
            channel, chunk = frame
            await ws.send_bytes(bytes([channel]) + chunk)
        await ws.send_bytes(b"\x03" + self.status)
        await ws.close()
        reader.cancel()
        return ws

    async def _read(self, ws: web.WebSocketResponse, stdin_closed: asyncio.Event) -> None:
        async for msg in ws:
            self._frames.put(bytes(msg.data))
            if bytes(msg.data) == b"\xff\x00":
                stdin_closed.set()
