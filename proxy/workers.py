"""Many proxy processes behind one port: `proxy.workers = N` (`forge proxy --workers N`).

    workers = ProxyWorkers(config, sockets=[tcp, uds], app_args={...}).start()   # returns once all serve
    ...
    workers.stop()                                                               # graceful: rows flushed

The parent binds the listening sockets (TCP and the unix socket sandboxes use) once; N spawned
processes each run the whole proxy (uvicorn + uvloop, its own engine client, recorder and prompt
state) and accept on those same sockets, so the kernel spreads connections over them. One process is
one core's worth of Python; at the proxy's CPU per call, N processes serve about N times the calls.

Why no router in front, and no rollout pinned to a worker: a front process that reads each request to
pick its worker would cost what a pass-through hop costs (a few ms of CPU per call, more than the
proxy itself now), and pinning by port would change how every harness is given its base URL.
Instead a rollout may land on any worker, and everything that must be exact lives in the store:

- `seq` is numbered inside the write transaction (BEGIN IMMEDIATE), so calls of one rollout from
  several processes are numbered once each, in commit order (as they are within one process).
- A worker reuses a rollout's sampled token ids only while it has seen the rollout's latest call: it
  compares the newest finished call in the store with the newest it remembers (one indexed read), and
  reloads the rollout's last turns from the store when another worker has served it since.

A harness keeps its connection alive between calls, so its calls stay on one worker until it opens a
new connection; a move costs one reload. Start-up recovery (in-flight calls of dead proxies marked
interrupted) runs once, in the parent, before the workers start: a worker must never take the calls
another worker is serving for leftovers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from openforge.config import ProxyConfig
from openforge.errors import ForgeError

log = logging.getLogger("forge.proxy")


def _worker_main(spec: dict[str, Any]) -> None:
    """One worker process (`python -m openforge.proxy.workers SPEC`): the proxy app on uvicorn in the main thread,
    so SIGTERM shuts it down gracefully; it writes one line on its `ready_fd` once it serves (or why not)."""
    import uvicorn

    from openforge.engine.serve import KEEP_ALIVE_S, quiet_shutdown_cancellations
    from openforge.proxy.app import create_app
    from openforge.proxy.connections import deadline_protocol
    from openforge.proxy.teacher import call_backends
    from openforge.proxy.tokens import load_tokenizer
    from openforge.proxy.vision import load_placeholders

    ready = os.fdopen(spec["ready_fd"], "w", buffering=1)
    try:
        config = ProxyConfig.model_validate(spec["config"])
        sockets = [socket.socket(fileno=fd) for fd in spec["fds"]]
        engine, teacher = call_backends(engine_url=spec["engine_url"], engine_key=spec["engine_key"],
                                        teacher=spec.get("teacher"), timeout=config.call_timeout_s)
        app = create_app(config, store_path=spec["store_path"], engine=engine, teacher=teacher,
                         tokenizer=load_tokenizer(spec["model_path"]), served_model=spec["served_model"],
                         close_engine=True, recover=False, shared_store=True,
                         vision=load_placeholders(spec["model_path"]))
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, loop="uvloop",
                                               http=deadline_protocol(config.read_timeout_s),
                                               timeout_keep_alive=KEEP_ALIVE_S, timeout_graceful_shutdown=2))
        quiet_shutdown_cancellations()

        def announce() -> None:
            while not server.started and not server.should_exit:
                time.sleep(0.01)
            with contextlib.suppress(OSError):
                ready.write("ok\n" if server.started else "exited before serving\n")
                ready.close()
        threading.Thread(target=announce, daemon=True).start()
    except Exception as exc:  # noqa: BLE001 - told to the parent, which refuses to start
        ready.write(f"{type(exc).__name__}: {exc}\n".replace("\n", " ").strip() + "\n")
        ready.close()
        raise SystemExit(1) from None
    server.run(sockets=sockets)


class ProxyWorkers:
    """`config.workers` processes serving the proxy on `sockets` (already bound and listening)."""

    def __init__(self, config: ProxyConfig, *, sockets: list[socket.socket], app_args: dict[str, Any],
                 startup_timeout: float = 180.0) -> None:
        self.config = config
        self.sockets = sockets
        self.app_args = app_args
        self.startup_timeout = startup_timeout
        self.procs: list[subprocess.Popen] = []
        self.restarts = 0
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    def start(self) -> ProxyWorkers:
        pipes = []
        try:
            for _ in range(self.config.workers):
                r, w = os.pipe()
                pipes.append(r)
                try:
                    self.procs.append(self._spawn(w))
                finally:
                    os.close(w)
            deadline = time.monotonic() + self.startup_timeout
            for i, r in enumerate(pipes):
                with os.fdopen(r, "r") as ready:
                    pipes[i] = -1
                    left = deadline - time.monotonic()
                    if not select.select([ready], [], [], max(0.0, left))[0]:
                        raise ForgeError(f"proxy worker {i} did not start within {self.startup_timeout:g}s")
                    line = ready.readline().strip()
                if line != "ok":
                    code = self.procs[i].poll()
                    raise ForgeError(f"proxy worker {i} failed to start: "
                                     f"{line or f'it exited (code {code})'}")
        except BaseException:
            for r in pipes:
                if r >= 0:
                    os.close(r)
            self.stop()
            raise
        self._watcher = threading.Thread(target=self._watch, name="forge-proxy-workers", daemon=True)
        self._watcher.start()
        return self

    def _watch(self) -> None:
        """A worker that dies (a crash, the OOM killer, kill -9) is replaced; the others serve meanwhile.
        What it had answered is recorded (a response goes out only after its row is committed); calls
        it was serving stay `in_flight` until the next start's recovery marks them interrupted."""
        while not self._stopping.wait(0.5):
            for i, proc in enumerate(list(self.procs)):
                if proc.poll() is None or self._stopping.is_set():
                    continue
                log.warning("proxy worker %d (pid %d) exited with code %s: starting another", i, proc.pid,
                            proc.returncode)
                try:
                    self.procs[i] = self._start_one()
                    self.restarts += 1
                except ForgeError as exc:
                    log.error("proxy worker %d could not be replaced: %s", i, exc)

    def _start_one(self) -> subprocess.Popen:
        r, w = os.pipe()
        try:
            proc = self._spawn(w)
        finally:
            os.close(w)
        with os.fdopen(r, "r") as ready:
            deadline = time.monotonic() + self.startup_timeout
            while not select.select([ready], [], [], 0.5)[0]:
                if self._stopping.is_set() or time.monotonic() > deadline:
                    proc.kill()
                    proc.wait(5)
                    raise ForgeError("stopped, or did not start in time")
            line = ready.readline().strip()
        if line != "ok":
            proc.kill()
            proc.wait(5)
            raise ForgeError(line or f"it exited (code {proc.poll()})")
        return proc

    def _spawn(self, ready_fd: int) -> subprocess.Popen:
        fds = [s.fileno() for s in self.sockets]
        spec = {**self.app_args, "config": self.config.model_dump(mode="json"), "fds": fds, "ready_fd": ready_fd}
        return subprocess.Popen([sys.executable, "-m", "openforge.proxy.workers", json.dumps(spec)], pass_fds=[*fds, ready_fd],
                                stdin=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                    p for p in (_PROJECT_ROOT, os.environ.get("PYTHONPATH")) if p)})

    def alive(self) -> int:
        return sum(p.poll() is None for p in self.procs)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM to each worker (uvicorn finishes its requests, the recorder commits what is
        queued), then SIGKILL for any still running after `timeout`."""
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.join(timeout)
            self._watcher = None
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("proxy worker %s did not stop within %gs: killed", p.pid, timeout)
                p.kill()
                p.wait(5)
        self.procs = []


_PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)

if __name__ == "__main__":
    _worker_main(json.loads(sys.argv[1]))
