"""A run that has ended has no call `in_flight` (issue 43: after a full disk, a cleanly stopped proxy left
one): the end of a run settles its calls, and a starting proxy settles any an ended run still holds,
whoever its recorded owner pid now is."""

from __future__ import annotations

import os

import pytest

from openforge.store import Call, Store


def _in_flight(store: Store, run_id: str) -> Call:
    rollout = store.create_rollout(run_id=run_id, task_id="proxy", status="running")
    return store.add_call(Call(run_id=run_id, rollout_id=rollout.id, status="in_flight"))


@pytest.mark.parametrize("status", ["stopped", "finished", "failed"])
def test_the_end_of_a_run_settles_its_calls_in_flight(store: Store, status: str) -> None:
    run = store.create_run(kind="proxy", owner_pid=os.getpid())
    store.set_run_status(run.id, "running")
    call = _in_flight(store, run.id)
    other = store.create_run(kind="proxy", owner_pid=os.getpid())  # a live run's call is left alone
    store.set_run_status(other.id, "running")
    live = _in_flight(store, other.id)
    store.set_run_status(run.id, status)
    settled = store.get_call(call.id)
    assert settled.status == "interrupted" and settled.ended_at is not None and "ended" in (settled.error or "")
    assert store.get_call(live.id).status == "in_flight"


def test_a_starting_proxy_settles_an_ended_runs_calls_whatever_its_owner_pid(store: Store) -> None:
    """The row a failed write left (its end never recorded) on a run that is `stopped`, whose recorded owner
    pid is alive again (here: this test's parent, as a reused pid would be)."""
    run = store.create_run(kind="proxy", owner_pid=os.getppid())
    store.set_run_status(run.id, "stopped")
    call = _in_flight(store, run.id)  # written after the end, as a late write would be
    assert store.recover(alive=lambda pid: True).calls == 1
    assert store.get_call(call.id).status == "interrupted"
