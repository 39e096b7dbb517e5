"""runs/train.py: a training run's lifecycle thread, waited on by the front end, and its end recorded in the store
(the whole run, stack up and torn down, is tests/e2e/test_up.py's; a disk that fills up, tests/e2e/test_faults.py's)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from openforge.runs.control import RunController
from openforge.runs.train import Outcome, RunThread, _record_end, fmt_num, run_log_handler, wait_for
from openforge.store import Store


def test_the_front_end_gets_the_threads_outcome_or_a_failure_when_it_has_none(store: Store) -> None:
    run = store.create_run()
    thread = RunThread(lambda: Outcome(status="finished", steps=[{"step": 0}]))
    thread.start()
    assert wait_for(thread, RunController(store, run.id)) == Outcome(status="finished", steps=[{"step": 0}])

    def crashes() -> Outcome:
        raise RuntimeError("the lifecycle itself broke")

    thread = RunThread(crashes)
    with pytest.raises(RuntimeError):
        thread.run()  # here, not in a thread of its own: the exception propagates, and `done` is still set
    assert thread.done.is_set()
    assert wait_for(thread, RunController(store, run.id)) == \
        Outcome(status="failed", error="the run thread ended without an outcome")


def test_a_stop_whose_teardown_hangs_ends_the_wait_after_the_grace(store: Store) -> None:
    run = store.create_run()
    release = threading.Event()
    thread = RunThread(lambda: (release.wait(30), Outcome(status="stopped"))[1])
    thread.start()
    controller = RunController(store, run.id)
    controller.stop()
    try:
        got = wait_for(thread, controller, grace_s=0.2)
    finally:
        release.set()
    assert got == Outcome(status="stopped", error="teardown did not finish within 0s")


def test_the_runs_end_is_recorded_and_nothing_of_it_stays_in_flight(store: Store) -> None:
    run = store.create_run()
    ro = store.create_rollout(run_id=run.id, task_id="t")
    store.update_rollout(ro.id, status="running")
    _record_end(store, run.id, Outcome(status="failed", error="EngineError: the engine died"))
    assert (store.get_run(run.id).status, store.get_run(run.id).error) == ("failed", "EngineError: the engine died")
    assert store.get_rollout(ro.id).status == "interrupted"
    other = store.create_run()
    _record_end(store, other.id, Outcome(status="stopped"))
    assert (store.get_run(other.id).status, store.get_run(other.id).error) == ("stopped", None)


def test_the_run_log_sits_where_the_dashboard_tails_it(tmp_path: Path) -> None:
    handler = run_log_handler(tmp_path, "run-1")
    try:
        assert Path(handler.baseFilename) == tmp_path / "runs" / "run-1" / "forge.log"
    finally:
        handler.close()
    assert (fmt_num(None), fmt_num(0.123456), fmt_num(1234567.0, 3)) == ("-", "0.1235", "1.23e+06")
