"""runs/proxy_session.py: `forge proxy --api-key K` takes K over from an ended proxy session only; a key another
run's rollout holds, or a live proxy still serves, is refused before anything starts (the whole session, engine
and proxy up, is tests/forge_cli/test_proxy_cli.py's)."""

from __future__ import annotations

import os

import pytest

from openforge.config import ForgeConfig
from openforge.errors import StoreError
from openforge.runs.proxy_session import ProxySession
from openforge.store import Store


def test_a_key_held_elsewhere_is_refused_before_anything_starts(store: Store) -> None:
    train = store.create_run(kind="train")
    store.create_rollout(run_id=train.id, task_id="t", key="forge-train-key", status="running")
    with pytest.raises(StoreError, match=f"belongs to a rollout of train run {train.id}; choose another"):
        ProxySession(ForgeConfig(), store, api_key="forge-train-key").start()
    live = store.create_run(kind="proxy", owner_pid=os.getpid())
    store.set_run_status(live.id, "running")
    store.create_rollout(run_id=live.id, task_id="proxy", key="forge-live-key", status="running")
    with pytest.raises(StoreError, match=f"is serving proxy run {live.id} .*forge stop {live.id}"):
        ProxySession(ForgeConfig(), store, api_key="forge-live-key").start()
    assert [r.kind for r in store.list_runs()].count("proxy") == 1  # no run was made for the refused sessions
