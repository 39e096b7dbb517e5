"""`forge proxy` without the CLI: an engine, the proxy, and one run with one rollout to record into.

    session = StandaloneProxy(config, store, model_path=..., api_key=None).start()
    print(session.run.id, session.url, session.api_key)
    ...
    stats = session.stop()   # assembles the rollout's trajectory, ends the run
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from openforge.config import ForgeConfig
from openforge.errors import ConfigError, StoreError
from openforge.store import Rollout, Run, Store
from proxy.server import ProxyServer
from proxy.trajectory import assemble_rollout


def engine_overrides(engine: str) -> dict[str, Any]:
    """`--engine embedded|sglang|URL` as engine config values."""
    if engine in ("embedded", "sglang"):
        return {"kind": engine}
    if engine.startswith(("http://", "https://")):
        return {"kind": "url", "url": engine}
    raise ConfigError(f"--engine must be 'embedded', 'sglang' or an http(s):// URL, got {engine!r}")


class StandaloneProxy:
    def __init__(self, config: ForgeConfig, store: Store, *, model_path: Path, api_key: str | None = None) -> None:
        self.config = config
        self.store = store
        self.model_path = model_path
        self.api_key = api_key
        self.engine: Any = None
        self.server: ProxyServer | None = None
        self.run: Run | None = None
        self.rollout: Rollout | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    def start(self) -> StandaloneProxy:
        from engine.supervisor import EngineProcess

        if self.api_key and self.store.rollout_by_key(self.api_key) is not None:
            raise StoreError("that --api-key already belongs to a rollout in this store; choose another")
        self.run = self.store.create_run(kind="proxy", name=self.config.name or "proxy", owner_pid=os.getpid(),
                                         config={**self.config.model_dump(mode="json"), "model": str(self.model_path)})
        self.store.set_run_status(self.run.id, "running")
        self.rollout = self.store.create_rollout(run_id=self.run.id, task_id="proxy", harness="external",
                                                 key=self.api_key, status="running")
        self.api_key = self.rollout.key
        try:
            self.engine = EngineProcess(self.config.engine, model_path=str(self.model_path))
            self.engine.start()
            self.server = ProxyServer(self.config.proxy, store_path=self.store.path, engine_url=self.engine.url,
                                      model_path=self.model_path).start()
        except BaseException as exc:
            self._shutdown()
            self.store.set_run_status(self.run.id, "failed", error=str(exc))
            self.store.update_rollout(self.rollout.id, status="failed", error=str(exc))
            raise
        return self

    def _shutdown(self) -> None:
        if self.server is not None:
            self.server.stop()
        if self.engine is not None:
            self.engine.stop()

    def stop(self) -> dict[str, int]:
        """Stop serving, assemble what was recorded, end the run. Returns the trajectory counts."""
        self._shutdown()
        assert self.run is not None and self.rollout is not None
        stats = assemble_rollout(self.store, self.rollout.id)
        self.store.update_rollout(self.rollout.id, status="cancelled")  # ended by its user, never scored
        self.store.set_run_status(self.run.id, "stopped")
        return stats
