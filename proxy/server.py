"""`ProxyServer`: the proxy on uvicorn in a background thread, for `forge up`, `forge proxy` and tests.

    server = ProxyServer(config.proxy, store_path=db, engine_url=engine.url, model_path=model_dir,
                         uds=run_dir / "proxy.sock", engine_key=key)
    server.start()          # returns once it accepts connections
    ... harnesses use server.url, or the unix socket server.uds (bound into sandboxes) ...
    server.stop()

One app serves both listeners: TCP on `config.host` (127.0.0.1) and, with `uds`, a unix socket, which
is how a sandbox without a network reaches it. With `config.workers` > 1 the listeners are served by
that many processes (proxy/workers.py); `app` is then None (each worker has its own).
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

from openforge.engine.serve import ServerHandle, listen_tcp, listen_unix, serve_in_thread
from openforge.config import ProxyConfig, RemoteEngineConfig
from openforge.db import location
from openforge.errors import ForgeError
from openforge.proxy.connections import deadline_protocol
from openforge.proxy.teacher import call_backends
from openforge.proxy.tokens import load_tokenizer
from openforge.proxy.vision import load_placeholders
from openforge.proxy.workers import ProxyWorkers


class ProxyServer:
    def __init__(self, config: ProxyConfig, *, store_path: str | Path, engine_url: str, model_path: str | Path,
                 served_model: str | None = None, uds: str | Path | None = None,
                 engine_key: str | None = None, teacher: RemoteEngineConfig | None = None) -> None:
        self.config = config
        self.store_path = location(store_path)  # an SQLite file, or a PostgreSQL URL
        self.engine_url = engine_url
        self.engine_key = engine_key
        self.teacher = teacher  # engine.kind = "remote": calls go to it; `model_path` is the student's
        self.model_path = Path(model_path)
        self.uds = str(uds) if uds is not None else None
        self.served_model = served_model or config.served_model_name
        self._handle: ServerHandle | None = None
        self._workers: ProxyWorkers | None = None  # with config.workers > 1
        self._url: str | None = None
        self.app = None  # the Starlette app once started (tests read app.state.proxy)
        self.interrupted_on_start = 0

    @property
    def url(self) -> str:
        if self._handle is not None:
            return self._handle.url
        if self._url is not None:
            return self._url
        raise ForgeError("the proxy is not running (call start() first)")

    @property
    def _teacher_json(self) -> dict | None:
        return self.teacher.model_dump(mode="json") if self.teacher is not None else None

    def start(self) -> ProxyServer:
        from openforge.proxy.app import create_app

        if self._handle is not None or self._workers is not None:
            return self
        if self.config.workers > 1:
            return self._start_workers()
        engine, teacher = call_backends(engine_url=self.engine_url, engine_key=self.engine_key,
                                        teacher=self._teacher_json, timeout=self.config.call_timeout_s)
        app = create_app(self.config, store_path=self.store_path, engine=engine, teacher=teacher,
                         tokenizer=load_tokenizer(self.model_path), served_model=self.served_model,
                         close_engine=True, vision=load_placeholders(self.model_path))
        self.app = app
        self.interrupted_on_start = app.state.proxy.interrupted_on_start
        self._handle = serve_in_thread(app, self.config.host, self.config.port, uds=self.uds,
                                       http=deadline_protocol(self.config.read_timeout_s))
        return self

    def _start_workers(self) -> ProxyServer:
        import psutil

        from openforge.store import Store

        store = Store(self.store_path)  # recovery once, here: a worker must not take its peers' calls for leftovers
        try:
            self.interrupted_on_start = store.recover(alive=psutil.pid_exists).calls
        finally:
            store.close()
        host, sockets = self.config.host, [listen_tcp(self.config.host, self.config.port, error=ForgeError)]
        try:
            if self.uds is not None:
                sockets.append(listen_unix(self.uds))
            args = {"store_path": str(self.store_path), "engine_url": self.engine_url, "engine_key": self.engine_key,
                    "model_path": str(self.model_path), "served_model": self.served_model,
                    "teacher": self._teacher_json}
            self._workers = ProxyWorkers(self.config, sockets=sockets, app_args=args).start()
        except BaseException:
            self._close_sockets(sockets)
            raise
        self._sockets = sockets
        shown = f"[{host}]" if ":" in host else host
        self._url = f"http://{shown}:{sockets[0].getsockname()[1]}"
        return self

    def _close_sockets(self, sockets: list[socket.socket]) -> None:
        for s in sockets:
            s.close()
        if self.uds is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.uds)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.stop()
            self._handle = None
        if self._workers is not None:
            self._workers.stop()
            self._workers = None
            self._close_sockets(self._sockets)
            self._url = None

    def __enter__(self) -> ProxyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
