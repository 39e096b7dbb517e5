"""`forge proxy` without the CLI: the engine and the proxy (a `Stack`), and one run with one rollout
whose key an outside harness records into.

    session = ProxySession(config, store, api_key=None).start()   # config.engine.model: the model folder
    print(session.run.id, session.url, session.api_key)
    session.key_was                  # the ended proxy run the same --api-key recorded into before, if any
    ...
    stats = session.stop()   # assembles the rollout's trajectory, ends the run
"""

from __future__ import annotations

import os

from openforge import reserve
from openforge.config import ForgeConfig
from openforge.errors import StoreError
from openforge.store import RUN_FINAL, Rollout, Run, Store
from openforge.runs.stack import Stack


class ProxySession:
    def __init__(self, config: ForgeConfig, store: Store, *, api_key: str | None = None) -> None:
        self.config, self.store, self.api_key = config, store, api_key
        self.stack = Stack(config, store)
        self.run: Run | None = None
        self.rollout: Rollout | None = None
        self.key_was: Run | None = None  # the ended proxy run this --api-key belonged to before this session

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
        if self.api_key and (held := self.store.rollout_with_key(self.api_key)) is not None:
            self.key_was = self._take_key(held)
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

    def _take_key(self, held: Rollout) -> Run:
        """A harness configured with one key is the usual reason to restart `forge proxy --api-key K`: the
        key moves from its ended proxy session to this new one (a new run; the old one keeps its record).
        A key still serving a live proxy, or given to another kind of run, is refused."""
        from openforge.runs.prepare import mark_dead_runs

        mark_dead_runs(self.store)  # a proxy killed without its clean stop no longer holds its key
        run = self.store.get_run(held.run_id)
        if run.kind != "proxy":
            raise StoreError(f"that --api-key belongs to a rollout of {run.kind} run {run.id}; choose another")
        if run.status not in RUN_FINAL:
            raise StoreError(f"that --api-key is serving proxy run {run.id} (pid {run.owner_pid}); stop it first "
                             f"(`forge stop {run.id}`) or choose another key")
        self.store.update_rollout(held.id, key_hash=None)  # keys are unique: the ended session gives it up
        return run

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
