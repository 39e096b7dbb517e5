"""`EngineProcess`: launch the engine as a child process, wait for /health, restart it if it dies.

    engine = EngineProcess(config.engine, log_path=run_dir / "engine.log")
    engine.start()            # blocks until /health answers (or raises EngineError with the log's tail)
    ... EngineClient(engine.url) ...
    engine.stop()             # SIGTERM to the child's process group, SIGKILL after a grace period

kind = "embedded" runs `python -m openforge.engine` (this project's engine), kind = "sglang" runs
`<sglang_python> -m sglang.launch_server` (see engine/sglang.py), kind = "url" launches nothing and
only waits for the engine already at `config.url`.

The engine's credential: a run takes `key = engine_api_key(config)` (`engine.api_key`, or a fresh
random key when that is empty), passes it as `EngineProcess(..., api_key=key)` and hands the same
key to the proxy's and the trainer's EngineClient in memory. The embedded child gets it in
FORGE_ENGINE_API_KEY (never argv), SGLang as `--api-key`. Without `api_key=` the process uses
`engine.api_key` as it is (empty: an engine without a credential). A child that dies is restarted on the same port,
at most `max_restarts` times; `on_restart` callbacks then run (e.g. to load the current adapter again,
since a fresh engine has none). `start`/`stop` are blocking; `astart`/`astop` are their async forms.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from openforge.engine.sglang import sglang_command, sglang_env
from openforge.engine.sglang_api import API_KEY_ENV
from openforge.config import EngineConfig, UrlEngineConfig
from openforge.errors import EngineError
from openforge.paths import forge_home
from openforge.ports import free_port

log = logging.getLogger("openforge.engine")


def make_engine_url(config: UrlEngineConfig) -> str:
    """The base URL of an engine that is already running (kind = "url")."""
    url = config.url.strip().rstrip("/")
    if not url:
        raise EngineError('engine.kind = "url" needs engine.url (e.g. http://gpu-host:30000)')
    if not url.startswith(("http://", "https://")):
        raise EngineError(f"engine.url must start with http:// or https://, got {config.url!r}")
    return url


def engine_api_key(config: EngineConfig) -> str:
    """The key a run's engine requires: `engine.api_key`, else a fresh one for this run. An engine
    forge does not launch (kind = "url") has whatever key it was started with: the configured one."""
    if config.api_key or config.kind == "url":
        return config.api_key
    return secrets.token_urlsafe(32)


def _tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"


class EngineProcess:
    """One supervised engine. `.url`, `.restarts`, `.pid`; `start()`, `stop()`."""

    def __init__(self, config: EngineConfig, *, model_path: str | None = None, log_path: str | Path | None = None,
                 max_restarts: int = 3, lora_target_modules: list[str] | None = None,
                 api_key: str | None = None) -> None:
        self.config = config
        self.model_path = model_path if model_path is not None else config.model
        self.max_restarts = max_restarts
        self.lora_target_modules = lora_target_modules
        self.port = 0 if config.kind == "url" else config.port  # a url engine's port is in its url
        self.api_key = config.api_key if api_key is None else api_key
        self.restarts = 0
        self.on_restart: list[Callable[[], None]] = []
        self.failure: str | None = None  # set when the child died and could not be brought back
        self._log_path = Path(log_path) if log_path else None
        self._proc: subprocess.Popen | None = None
        self._stopping = threading.Event()
        self._monitor: threading.Thread | None = None

    # -- facts ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self.config.kind == "url":
            return make_engine_url(self.config)
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        return f"http://{host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def log_path(self) -> Path:
        if self._log_path is None:
            self._log_path = forge_home() / "logs" / f"engine-{self.config.kind}-{self.port}.log"
        return self._log_path

    def command(self) -> list[str]:
        """The child's argv (the port must be chosen already)."""
        c = self.config
        if c.kind == "sglang":
            if not self.model_path:
                raise EngineError('engine.kind = "sglang" needs engine.model (a checkpoint folder or hub id)')
            return sglang_command(c, model_path=self.model_path, port=self.port,
                                  lora_target_modules=self.lora_target_modules, api_key=self.api_key)
        if c.kind == "router":  # engine/router.py: workers + sglang-router; the key goes in the environment
            cfg = c.model_copy(update={"model": self.model_path, "port": self.port})
            return [sys.executable, "-m", "openforge.engine.router", "--config-json", cfg.model_dump_json(exclude={"api_key"}),
                    "--log-dir", str(self.log_path.parent / f"router-{self.port}"), "--parent-pid", str(os.getpid())]
        return [sys.executable, "-m", "openforge.engine", "--model", self.model_path, "--host", c.host, "--port", str(self.port),
                "--dtype", c.dtype, "--device", c.device, "--max-batch-size", str(c.max_batch_size), "--seed", str(c.seed),
                "--prefix-cache-mb", str(c.prefix_cache_mb),
                "--parent-pid", str(os.getpid())]

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Launch the child and block until it is healthy; EngineError (with the log's tail) otherwise."""
        if self.config.kind == "url":
            self._wait_healthy(self.config.startup_timeout_s)
            return
        if self._proc is not None:
            raise EngineError("this engine process is already started")
        if not self.port:
            self.port = free_port(self.config.host)
        self._stopping.clear()
        atexit.register(self.stop)
        self._launch()
        try:
            self._wait_healthy(self.config.startup_timeout_s)
        except EngineError:
            self.stop()
            raise
        self._monitor = threading.Thread(target=self._watch, name=f"engine-monitor-{self.port}", daemon=True)
        self._monitor.start()

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop the child's whole process group: SIGTERM, then SIGKILL after `grace_s`."""
        self._stopping.set()
        atexit.unregister(self.stop)
        proc = self._proc
        if proc is not None and proc.poll() is None:
            self._signal(proc, signal.SIGTERM)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self._signal(proc, signal.SIGKILL)
                proc.wait(5)
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(5)
        self._proc = None

    async def astart(self) -> None:
        await asyncio.to_thread(self.start)

    async def astop(self) -> None:
        await asyncio.to_thread(self.stop)

    def __enter__(self) -> EngineProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals --------------------------------------------------------------------------

    @staticmethod
    def _signal(proc: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)  # the child leads its own session: this reaches its workers too
        except (ProcessLookupError, PermissionError):
            pass

    def _launch(self) -> None:
        cmd = self.command()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.pop(API_KEY_ENV, None)
        if self.config.kind == "sglang":
            env.update(sglang_env())
        if self.config.kind in ("embedded", "router") and self.api_key:
            env[API_KEY_ENV] = self.api_key
        shown = ["***" if i and cmd[i - 1] == "--api-key" else a for i, a in enumerate(cmd)]  # no key in logs
        with open(self.log_path, "ab") as out:
            out.write(f"\n==> {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(shown)}\n".encode())
            out.flush()
            try:
                self._proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              env=env, start_new_session=True)
            except OSError as exc:
                raise EngineError(f"cannot run {cmd[0]}: {exc.strerror or exc}") from None
        log.info("engine (%s) launched, pid %d, log %s", self.config.kind, self._proc.pid, self.log_path)

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2.0) as http:
            while True:
                proc = self._proc
                if self.config.kind != "url" and proc is not None and proc.poll() is not None:
                    raise EngineError(f"the {self.config.kind} engine exited with code {proc.returncode} before it "
                                      f"became healthy; {self.log_path}: {_tail(self.log_path)}")
                try:
                    if http.get(f"{self.url}/health").status_code == 200:
                        self._check_key(http)
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    where = "" if self.config.kind == "url" else f"; {self.log_path}: {_tail(self.log_path)}"
                    raise EngineError(f"engine at {self.url} did not become healthy within {timeout:g}s{where}")
                if self._stopping.is_set():
                    raise EngineError("the engine was stopped while starting")
                time.sleep(0.2)

    def _check_key(self, http: httpx.Client) -> None:
        """/health needs no key, so a wrong one would only show at the first call: test it now."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        if http.get(f"{self.url}/model_info", headers=headers).status_code == 401:
            which = "the key forge holds" if self.api_key else "no key (engine.api_key is empty)"
            raise EngineError(f"engine at {self.url} refused {which}: set engine.api_key to the key it was "
                              "started with (SGLang's --api-key)")

    def _watch(self) -> None:
        """Monitor thread: wait for the child; if it died on its own, bring it back (bounded)."""
        while not self._stopping.is_set():
            proc = self._proc
            if proc is None:
                return
            code = proc.wait()
            if self._stopping.is_set():
                return
            if self.restarts >= self.max_restarts:
                self.failure = (f"the {self.config.kind} engine died (exit code {code}) and was restarted "
                                f"{self.restarts} times already; giving up. {self.log_path}: {_tail(self.log_path)}")
                log.error("%s", self.failure)
                return
            self.restarts += 1
            log.warning("engine exited with code %s; restart %d of %d", code, self.restarts, self.max_restarts)
            time.sleep(min(0.5 * 2 ** (self.restarts - 1), 5.0))
            try:
                self._launch()
                self._wait_healthy(self.config.startup_timeout_s)
            except EngineError as exc:
                log.error("engine restart failed: %s", exc)
                continue  # the loop sees the dead child at once and counts another restart
            for callback in list(self.on_restart):
                try:
                    callback()
                except Exception:  # noqa: BLE001 - a failing hook must not stop supervision
                    log.exception("an on_restart callback failed")
