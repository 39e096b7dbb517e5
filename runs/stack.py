"""The services one run needs, up and down as one: the engine, the recording proxy in front of it,
and (for rollouts) the runner and the trainer's own line to the engine.

    with Stack(config, store, log_dir=home / "runs" / run_id, runner=True, client=True) as stack:
        stack.proxy_url, stack.runner, stack.client, stack.bridge

`forge up`, `forge train`, `forge eval` and `forge proxy` all bring their services up through it.
The engine takes a key made for this run (`engine.api_key` if set) that only the proxy and the
trainer's client are given; the proxy also listens on a unix socket (`stack.proxy_socket`), the one
door that sandboxes are given.
Engine and proxy start side by side (each spends its first seconds importing and loading the model);
then the runner and the engine client. Teardown is the reverse, whatever ends the block, and a
failure at any stage still stops what was started before it. `abort()`, from another thread, ends a
start that is still waiting for the engine.
"""

from __future__ import annotations

import logging
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from openforge.config import ForgeConfig, RemoteEngineConfig
from openforge.store import Store
from openforge.trainer.bridge import BackgroundLoop

log = logging.getLogger("forge.stack")


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class Stack:
    """Engine + proxy (+ runner, + the trainer's engine client) for `config`; a context manager.

    `config.engine.model` must be the resolved model folder (`openforge.runs.prepare.resolve_model`)."""

    def __init__(self, config: ForgeConfig, store: Store, *, log_dir: Path | None = None, runner: bool = False,
                 client: bool = False, on_progress: Callable[[Any], Any] | None = None) -> None:
        self.config, self.store, self.log_dir = config, store, log_dir
        self._want_runner, self._want_client, self._on_progress = runner, client, on_progress
        self.engine: Any = None  # engine.supervisor.EngineProcess
        self.proxy: Any = None  # proxy.server.ProxyServer
        self.runner: Any = None  # rollouts.runner.RolloutRunner
        self.client: Any = None  # engine.client.EngineClient, the trainer's (adapter loads)
        self.bridge: BackgroundLoop | None = None  # the loop the runner and the client run on
        self.engine_key = ""  # the engine's credential: only the proxy and the trainer's client hold it
        self.proxy_socket: Path | None = None  # the proxy's unix socket, what sandboxes are given
        self._started: list[tuple[str, Callable[[], Any]]] = []  # (what, stop), in start order
        self._booting: threading.Thread | None = None

    @property
    def proxy_url(self) -> str:
        return self.proxy.url

    @property
    def engine_failure(self) -> str | None:
        """Why the engine is gone for good (its supervisor gave up restarting it), or None."""
        return self.engine.failure if self.engine is not None else None

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Stack:
        try:
            self._start_engine_and_proxy()
            if self._want_runner or self._want_client:
                self.bridge = BackgroundLoop()
                self._started.append(("event loop", self.bridge.close))
            if self._want_runner:
                self._start_runner()
            if self._want_client:
                self._start_client()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_engine_and_proxy(self) -> None:
        from openforge.engine.supervisor import EngineProcess, engine_api_key
        from openforge.proxy.server import ProxyServer

        cfg = self.config.engine
        if cfg.kind == "remote":  # a teacher's endpoint: no engine here, every call goes upstream
            self._start_teacher_proxy()
            return
        if cfg.kind != "url" and not cfg.port:  # fix the port now: the proxy needs the URL before it is up
            cfg = cfg.model_copy(update={"port": free_port(cfg.host)})
        self.engine_key = engine_api_key(cfg)  # engine.api_key, else a fresh one for this run
        self.engine = EngineProcess(cfg, log_path=self.log_dir / "engine.log" if self.log_dir else None,
                                    lora_target_modules=self.config.trainer.lora_target_modules,
                                    api_key=self.engine_key)
        self._started.append(("engine", self.engine.stop))
        # A short private folder: a unix socket path must fit in 108 bytes, a run folder may not.
        sock_dir = Path(tempfile.mkdtemp(prefix="forge-proxy-"))
        self._started.append(("proxy socket folder", lambda: shutil.rmtree(sock_dir, ignore_errors=True)))
        self.proxy_socket = sock_dir / "proxy.sock"
        failed: list[BaseException] = []

        def boot() -> None:
            try:
                self.engine.start()
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread below
                failed.append(exc)

        self._booting = threading.Thread(target=boot, name="forge-engine-start", daemon=True)
        self._booting.start()
        try:
            self.proxy = ProxyServer(self.config.proxy, store_path=self.store.path, engine_url=self.engine.url,
                                     model_path=cfg.model, uds=self.proxy_socket, engine_key=self.engine_key or None)
            self._started.append(("proxy", self.proxy.stop))
            self.proxy.start()
            log.info("proxy up at %s and %s", self.proxy.url, self.proxy_socket)
        finally:
            self._booting.join()
        if failed:
            raise failed[0]
        log.info("engine (%s) up at %s serving %s", cfg.kind, self.engine.url, cfg.model)

    def _start_teacher_proxy(self) -> None:
        from openforge.proxy.server import ProxyServer

        sock_dir = Path(tempfile.mkdtemp(prefix="forge-proxy-"))
        self._started.append(("proxy socket folder", lambda: shutil.rmtree(sock_dir, ignore_errors=True)))
        self.proxy_socket = sock_dir / "proxy.sock"
        cfg = self.config.engine
        assert isinstance(cfg, RemoteEngineConfig)
        self.proxy = ProxyServer(self.config.proxy, store_path=self.store.path, engine_url="", model_path=cfg.model,
                                 uds=self.proxy_socket, teacher=cfg)
        self._started.append(("proxy", self.proxy.stop))
        self.proxy.start()
        log.info("proxy up at %s and %s, in front of the teacher %s at %s", self.proxy.url, self.proxy_socket,
                 cfg.upstream_model, cfg.url)

    def _start_runner(self) -> None:
        from openforge.rollouts.runner.runner import RolloutRunner

        self.runner = RolloutRunner(self.store, config=self.config, proxy_url=self.proxy.url,
                                    on_progress=self._on_progress, proxy_socket=str(self.proxy_socket))
        log.info("runner: %s harness in %s sandboxes, %d at a time", ", ".join(self.config.harness.weights()),
                 self.config.sandbox.type, self.config.runner.concurrency)

    def _start_client(self) -> None:
        from openforge.engine.client import EngineClient

        if self.engine is None:  # a teacher's endpoint: there is no engine to load adapters into
            return

        self.client = EngineClient(self.engine.url, timeout=self.config.engine.request_timeout_s,
                                   api_key=self.engine_key or None)
        bridge = self.bridge
        assert bridge is not None
        self._started.append(("engine client", lambda: bridge.run(self.client.aclose())))

    def abort(self) -> None:
        """From another thread: a start still waiting for the engine gives up now (the run is stopping)."""
        if self._booting is not None and self._booting.is_alive() and self.engine is not None:
            self.engine.stop()

    def stop(self) -> None:
        """Stop what was started, newest first; a part that fails to stop does not keep the rest up."""
        while self._started:
            what, stop = self._started.pop()
            try:
                stop()
                log.info("stopped the %s", what)
            except Exception as exc:  # noqa: BLE001 - keep stopping the rest
                log.warning("stopping the %s failed: %s", what, exc)
