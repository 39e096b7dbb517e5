"""`forge proxy` without the CLI: the engine and the proxy (a `Stack`), and one run with one rollout
whose key an outside harness records into.

    session = ProxySession(config, store, api_key=None).start()   # config.engine.model: the model folder
    print(session.run.id, session.url, session.api_key)
    ...
    stats = session.stop()   # assembles the rollout's trajectory, ends the run
"""

from __future__ import annotations

import os

from openforge import reserve
from openforge.config import ForgeConfig
from openforge.errors import StoreError
from openforge.store import Rollout, Run, Store
from openforge.runs.stack import Stack


class ProxySession:
    def __init__(self, config: ForgeConfig, store: Store, *, api_key: str | None = None) -> None:
        self.config, self.store, self.api_key = config, store, api_key
        self.stack = Stack(config, store)
        self.run: Run | None = None
        self.rollout: Rollout | None = None

    @property
    def url(self) -> str:
        return self.stack.proxy_url

    @property
    def engine_url(self) -> str:
        return self.stack.engine.url

    @property
    def interrupted_on_start(self) -> int:
        """Calls left in flight by a proxy that died, marked interrupted as this one started."""
        return self.stack.proxy.interrupted_on_start

    def start(self) -> ProxySession:
        if self.api_key and self.store.key_in_use(self.api_key):
            raise StoreError("that --api-key already belongs to a rollout in this store; choose another")
        self.run = self.store.create_run(kind="proxy", name=self.config.name or "proxy", owner_pid=os.getpid(),
                                         config={**self.config.model_dump(mode="json"),
                                                 "model": self.config.engine.model})
        self.store.set_run_status(self.run.id, "running")
        self.rollout = self.store.create_rollout(run_id=self.run.id, task_id="proxy", harness="external",
                                                 key=self.api_key, status="running")
        self.api_key = self.rollout.key
        reserve.hold(self.store.path)  # room to record the session's end should the disk fill up
        try:
            self.stack.start()
        except BaseException as exc:
            self.store.set_run_status(self.run.id, "failed", error=str(exc))
            self.store.update_rollout(self.rollout.id, status="failed", error=str(exc))
            raise
        return self

    def stop(self) -> dict[str, int]:
        """Stop serving, assemble what was recorded, end the run. Returns the trajectory counts."""
        from openforge.rollouts.runner.trajectory import assemble_rollout

        self.stack.stop()
        assert self.run is not None and self.rollout is not None
        try:
            stats = assemble_rollout(self.store, self.rollout.id)
        except StoreError as exc:  # a full disk: the run still ends `stopped`, saying why (the reserve's room)
            if not reserve.is_disk_full(exc):
                raise
            reserve.write_despite_full_disk(self.store.path, lambda: self._end(error=str(exc)))
            raise StoreError(f"{exc} (the run is marked stopped; its trajectory was not assembled)") from None
        reserve.write_despite_full_disk(self.store.path, self._end)
        reserve.release(self.store.path)
        return stats

    def _end(self, error: str | None = None) -> None:
        assert self.run is not None and self.rollout is not None
        self.store.update_rollout(self.rollout.id, status="cancelled", error=error)  # ended by its user, never scored
        self.store.set_run_status(self.run.id, "stopped", error=error)
