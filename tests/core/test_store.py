"""The run store: every table round-trips, concurrent writers lose nothing, kills leave it consistent."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.paths import DATA
from openforge import migrations
from openforge import store as store_mod
from openforge.async_store import AsyncStore
from openforge.errors import NotFoundError, StoreError
from openforge.store import Call, Checkpoint, Store, TrainStep, Trajectory


def test_every_table_round_trips(store: Store) -> None:
    run = store.create_run(kind="train", name="demo", config={"trainer": {"lr": 1e-4}}, owner_pid=os.getpid())
    store.add_tasks(run.id, [{"id": "t1", "instruction": "make a.txt"}, {"id": "t2", "instruction": "x"}])
    store.add_tasks(run.id, [{"id": "t1", "instruction": "again"}])  # re-adding is a no-op
    rollout = store.create_rollout(run_id=run.id, task_id="t1", step=3, sample_index=1, sandbox="local",
                                   harness="mini", adapter="step-2")
    store.update_rollout(rollout.id, status="running")
    store.update_rollout(rollout.id, status="scored", reward=0.5, exit_code=0, stdout="out")
    call = store.add_call(Call(run_id=run.id, rollout_id=rollout.id, seq=0, api="openai_chat", status="ok",
                               request_json={"messages": []}, prompt_ids=[1, 2, 3],
                               completion_ids=[4, 5], logprobs=[-0.1, -0.2],
                               finish_reason="stop", prompt_tokens=3, completion_tokens=2, latency_ms=1.5))
    store.replace_trajectories(rollout.id, [Trajectory(run_id=run.id, rollout_id=rollout.id, segment=0,
                                                       token_ids=[1, 2, 3, 4, 5],
                                                       loss_mask=[0, 0, 0, 1, 1],
                                                       logprobs=[0, 0, 0, -0.1, -0.2],
                                                       call_ids=[call.id], n_tokens=5)])
    store.add_train_step(TrainStep(run_id=run.id, step=0, loss=0.25, reward_mean=0.5, kl=0.0,
                                   mismatch_max=1e-6, metrics_json={"lr": 1e-4}))
    store.add_checkpoint(Checkpoint(run_id=run.id, step=0, path="/tmp/a", adapter_name="step-0", loaded=True))

    again = Store(store.path)  # a second handle reads what the first wrote
    got = again.get_run(run.id)
    assert (got.name, got.kind, got.config_json) == ("demo", "train", {"trainer": {"lr": 1e-4}})
    assert [t.task_id for t in again.list_tasks(run.id)] == ["t1", "t2"]
    ro = again.get_rollout(rollout.id)
    assert (ro.status, ro.reward, ro.step, ro.adapter) == ("scored", 0.5, 3, "step-2")
    assert ro.started_at is not None and ro.ended_at is not None and ro.ended_at >= ro.started_at
    assert ro.key_hash == store_mod.hash_key(rollout.key)
    (c,) = again.list_calls(rollout_id=rollout.id)
    assert c.prompt_ids == [1, 2, 3] and c.logprobs == [-0.1, -0.2]
    (tr,) = again.list_trajectories(rollout_ids=[rollout.id])
    assert tr.loss_mask == [0, 0, 0, 1, 1]
    (st,) = again.list_train_steps(run.id)
    assert st.loss == 0.25 and st.metrics_json == {"lr": 1e-4}
    assert again.latest_checkpoint(run.id).adapter_name == "step-0"
    assert again.get_run(run.id[:-2]).id == run.id  # a unique prefix finds it
    assert again.get_run("latest").id == run.id


def test_unknown_ids_are_clear_errors(store: Store) -> None:
    with pytest.raises(NotFoundError, match="no run 'nope'"):
        store.get_run("nope")
    with pytest.raises(NotFoundError):
        store.get_rollout("ro-missing")
    with pytest.raises(NotFoundError):
        store.get_call(12345)


def test_wal_mode_and_fresh_schema_is_stamped(store: Store) -> None:
    con = sqlite3.connect(store.path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    versions = [v for (v,) in con.execute("SELECT version FROM schema_migrations ORDER BY version")]
    assert versions == [m[0] for m in store_mod.MIGRATIONS]
    assert store.schema_version() == store_mod.SCHEMA_VERSION
    assert store.integrity_check() == "ok"


def test_pending_migrations_run_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "forge.db"
    Store(path).close()
    applied: list[int] = []

    def add_column(conn) -> None:  # a later schema change, the way a real one would be written
        applied.append(2)
        conn.exec_driver_sql("ALTER TABLE rollout ADD COLUMN cost FLOAT")

    nxt = store_mod.MIGRATIONS[-1][0] + 1
    monkeypatch.setattr(migrations, "MIGRATIONS", [*store_mod.MIGRATIONS, (nxt, "rollout.cost", add_column)])
    Store(path).close()
    Store(path).close()
    assert applied == [2]
    cols = [r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(rollout)")]
    assert "cost" in cols


def test_newer_schema_and_foreign_sqlite_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "forge.db"
    Store(path).close()
    con = sqlite3.connect(path)
    con.execute("INSERT INTO schema_migrations (version, name, applied_at) VALUES (99, 'future', '2030-01-01')")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="newer than this forge"):
        Store(path)
    other = tmp_path / "other.db"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE x (a)")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="not an OpenForge store"):
        Store(other)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StoreError):
        Store(junk)


def test_locked_database_is_one_clear_error(store: Store) -> None:
    run = store.create_run(name="x")
    blocker = sqlite3.connect(store.path, timeout=0.1)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        # A short busy timeout keeps the test quick; the message is what a user sees.
        with store.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA busy_timeout=100")
        store.engine.dispose()
        from sqlalchemy import event

        event.listen(store.engine, "connect", lambda c, r: c.execute("PRAGMA busy_timeout=100"))
        with pytest.raises(StoreError, match="locked"):
            store.update_run(run.id, name="y")
    finally:
        blocker.rollback()
        blocker.close()


async def test_concurrent_async_writers_lose_no_rows(store: Store) -> None:
    run = store.create_run()
    rollout = store.create_rollout(run_id=run.id, task_id="t")
    astore = AsyncStore(store.path)
    payload = list(range(500))

    async def writer(w: int) -> list[int]:
        ids: list[int] = []
        for i in range(10):
            rows = [dict(run_id=run.id, rollout_id=rollout.id, seq=w * 1000 + i * 5 + j, api="openai_chat",
                         status="ok", prompt_ids=payload, completion_ids=payload, started_at=store_mod.utcnow())
                    for j in range(5)]
            ids += await astore.insert_calls(rows)
        return ids

    results = await asyncio.gather(*(writer(w) for w in range(8)))
    await astore.close()
    all_ids = [i for ids in results for i in ids]
    assert len(all_ids) == len(set(all_ids)) == 8 * 10 * 5
    assert len(store.list_calls(run_id=run.id)) == 400


async def test_async_store_updates_and_key_lookup(store: Store) -> None:
    run = store.create_run()
    rollout = store.create_rollout(run_id=run.id, task_id="t", adapter="a1")
    astore = AsyncStore(store.path)
    (cid,) = await astore.insert_calls([dict(run_id=run.id, rollout_id=rollout.id, seq=0, status="in_flight",
                                             started_at=store_mod.utcnow())])
    await astore.update_calls([(cid, {"status": "ok", "completion_ids": [7]})])
    found = await astore.rollout_by_key(rollout.key)
    assert found == {"id": rollout.id, "run_id": run.id, "status": "pending", "adapter": "a1"}
    assert await astore.rollout_by_key("forge-wrong") is None
    calls = await astore.calls_of_rollout(rollout.id)
    assert [c.completion_ids for c in calls] == [[7]]
    await astore.close()


_WRITER = textwrap.dedent("""
    import json, sys
    from openforge.store import Store, Call
    s = Store(sys.argv[1])
    run = s.create_run(run_id="run-killed", owner_pid=None)
    s.update_run(run.id, status="running")
    ro = s.create_rollout(run_id=run.id, task_id="t", status="running")
    print("ready", flush=True)
    i = 0
    while True:
        s.add_call(Call(run_id=run.id, rollout_id=ro.id, seq=i, status="ok", prompt_ids=[i] * 200))
        i += 1
""")


def test_killed_writer_leaves_a_consistent_db(tmp_path: Path) -> None:
    path = tmp_path / "forge.db"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    import time

    time.sleep(0.5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    s = Store(path)
    assert s.integrity_check() == "ok"
    calls = s.list_calls(run_id="run-killed")
    assert len(calls) > 0
    assert [c.seq for c in calls] == list(range(len(calls)))  # no hole: every commit is whole
    assert s.mark_interrupted(alive=lambda pid: False) == []  # no owner pid recorded
    s.update_run("run-killed", owner_pid=proc.pid)
    assert s.mark_interrupted(alive=lambda pid: False) == ["run-killed"]
    assert s.get_run("run-killed").status == "interrupted"
    assert {r.status for r in s.list_rollouts("run-killed")} == {"interrupted"}


async def test_insert_calls_with_mixed_columns_keeps_order(store: Store) -> None:
    run = store.create_run()
    astore = AsyncStore(store.path)
    rows = [dict(run_id=run.id, rollout_id="r", seq=0, started_at=store_mod.utcnow()),
            dict(run_id=run.id, rollout_id="r", seq=1, status="ok", started_at=store_mod.utcnow()),
            dict(run_id=run.id, rollout_id="r", seq=2, started_at=store_mod.utcnow())]
    ids = await astore.insert_calls(rows)
    await astore.close()
    by_id = {c.id: c for c in store.list_calls(run_id=run.id)}
    assert [by_id[i].seq for i in ids] == [0, 1, 2]
    assert by_id[ids[1]].status == "ok"


def _old_store(path: Path, *, drop_v2: bool = False) -> None:
    """A store as schema version 2 wrote it, with data (tests/data/store_schema2.sql)."""
    con = sqlite3.connect(path)
    con.executescript((DATA / "store_schema2.sql").read_text())
    if drop_v2:  # and as version 1 did, before the rollout-state index
        con.execute("DROP INDEX ix_rollout_run_status")
        con.execute("DELETE FROM schema_migrations WHERE version > 1")
    con.commit()
    con.close()


def _store_at_schema(path: Path, version: int) -> None:
    """The old store at `path`, migrated as far as schema `version` only (as that forge left it)."""
    _old_store(path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(migrations, "MIGRATIONS", [m for m in store_mod.MIGRATIONS if m[0] <= version])
        Store(path).close()


def test_a_version_1_store_gets_the_rollout_state_index(tmp_path: Path) -> None:
    path = tmp_path / "forge.db"
    _old_store(path, drop_v2=True)
    s = Store(path)
    assert s.schema_version() == store_mod.SCHEMA_VERSION
    names = [r[1] for r in sqlite3.connect(path).execute("PRAGMA index_list(rollout)")]
    assert "ix_rollout_run_status" in names
    plan = sqlite3.connect(path).execute(
        "EXPLAIN QUERY PLAN SELECT count(*) FROM rollout WHERE run_id='r' AND status='running'").fetchall()
    assert "ix_rollout_run_status" in str(plan)


def test_a_schema_2_store_upgrades_with_its_keys_hashed(tmp_path: Path) -> None:
    path = tmp_path / "forge.db"
    _old_store(path)
    s = Store(path)
    assert s.schema_version() == store_mod.SCHEMA_VERSION and s.integrity_check() == "ok"
    con = sqlite3.connect(path)
    cols = {t: [r[1] for r in con.execute(f"PRAGMA table_info({t})")] for t in ("rollout", "call", "run")}
    assert "api_key" not in cols["rollout"] and {"key_hash", "failure_kind"} <= set(cols["rollout"])
    assert {"temperature", "top_p", "top_k", "break_reason"} <= set(cols["call"])
    assert "isolation" in cols["run"]
    assert s.rollout_by_key("forge-old-key-2").status == "running"  # the key a live harness holds works
    assert s.rollout_by_key("forge-old-key-1") is None  # a scored rollout's key does not
    scored = [r for r in s.list_rollouts("run-20261201-aaaaaaaaaa") if r.status == "scored"]
    assert [(r.reward, r.key_hash) for r in scored] == [(1.0, store_mod.hash_key("forge-old-key-1"))]
    # The duplicated seq of the old store is renumbered in id order; the rest keep their numbers.
    running = s.rollout_by_key("forge-old-key-2").id
    assert [(c.seq, c.prompt_ids) for c in s.list_calls(rollout_id=running)] == \
        [(0, [0, 1]), (1, [1, 2]), (2, [2, 3]), (3, [3, 4])]
    with pytest.raises(sqlite3.IntegrityError):
        con.execute("INSERT INTO call (run_id, rollout_id, seq, api, model, stream, status, tool_parse_error, "
                    "reused_tokens, prompt_tokens, completion_tokens, started_at) "
                    "VALUES ('r', ?, 0, '', '', 0, 'ok', 0, 0, 0, 0, '2026-01-01')", (running,))
    con.close()
    s.close()
    # No plain key is left anywhere in the file (secure_delete zeroed the freed pages).
    data = path.read_bytes() + (path.with_name("forge.db-wal").read_bytes() if path.with_name("forge.db-wal").exists() else b"")
    assert b"forge-old-key" not in data
    assert Store(path).schema_version() == store_mod.SCHEMA_VERSION  # opening again runs nothing


def test_a_schema_3_store_gets_image_columns(tmp_path: Path) -> None:
    """Schema 4 adds call.images and trajectory.images; the rows already there keep NULL."""
    path = tmp_path / "forge.db"
    _store_at_schema(path, 3)  # the store as schema 3 left it
    con = sqlite3.connect(path)
    assert "images" not in [r[1] for r in con.execute("PRAGMA table_info(call)")]
    con.close()
    s = Store(path)
    assert s.schema_version() == store_mod.SCHEMA_VERSION and s.integrity_check() == "ok"
    con = sqlite3.connect(path)
    for table in ("call", "trajectory"):
        assert "images" in [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
    assert {c.images for c in s.list_calls(run_id="run-20261201-aaaaaaaaaa")} == {None}
    run = s.create_run()
    rollout = s.create_rollout(run_id=run.id, task_id="t")
    s.replace_trajectories(rollout.id, [store_mod.Trajectory(
        run_id=run.id, rollout_id=rollout.id, segment=0, token_ids=[1, 2], loss_mask=[0, 1], logprobs=[0.0, -0.5],
        call_ids=[], images=["ab" * 32])])
    assert [t.images for t in s.list_trajectories(rollout_ids=[rollout.id])] == [["ab" * 32]]
    s.close()


def test_only_the_hash_of_a_rollout_key_is_stored(store: Store) -> None:
    run = store.create_run()
    rollout = store.create_rollout(run_id=run.id, task_id="t")
    mine = store.create_rollout(run_id=run.id, task_id="t", key="forge-chosen-by-user")
    assert rollout.key.startswith("forge-") and len(rollout.key) > 30 and mine.key == "forge-chosen-by-user"
    assert rollout.key_hash == store_mod.hash_key(rollout.key) and len(rollout.key_hash) == 64
    assert store.get_rollout(rollout.id).key is None  # read back, a rollout carries no plain key
    assert store.rollout_by_key("forge-chosen-by-user").id == mine.id
    assert store.rollout_by_key(rollout.key_hash) is None  # the hash itself is not a credential
    assert store.key_in_use("forge-chosen-by-user") and not store.key_in_use("forge-unused")
    assert store_mod.new_rollout_key() != store_mod.new_rollout_key()
    store.close()
    assert rollout.key.encode() not in store.path.read_bytes()


_NUMBERING_WRITER = textwrap.dedent("""
    import asyncio, sys
    from openforge.async_store import AsyncStore
    from openforge.store import utcnow

    async def main(path, run_id, rollouts, batches):
        astore = AsyncStore(path)
        for b in range(batches):
            rows = [dict(run_id=run_id, rollout_id=rollouts[(b + i) % len(rollouts)], status="ok",
                         prompt_ids=[1, 2, 3], started_at=utcnow()) for i in range(5)]
            await astore.write_calls(rows, [], number=True)
        await astore.close()

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3].split(","), int(sys.argv[4])))
""")


def test_two_writer_processes_never_number_a_call_twice(store: Store) -> None:
    run = store.create_run()
    rollouts = [store.create_rollout(run_id=run.id, task_id="t").id for _ in range(3)]
    batches = 60
    procs = [subprocess.Popen([sys.executable, "-c", _NUMBERING_WRITER, str(store.path), run.id,
                               ",".join(rollouts), str(batches)], stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    calls = store.list_calls(run_id=run.id)
    assert len(calls) == 3 * batches * 5
    for rid in rollouts:
        seqs = sorted(c.seq for c in calls if c.rollout_id == rid)
        assert seqs == list(range(len(seqs)))  # no duplicate, no hole


async def test_write_calls_numbers_each_rollouts_calls_in_one_transaction(store: Store) -> None:
    run = store.create_run()
    astore = AsyncStore(store.path)
    now = store_mod.utcnow()
    first = await astore.write_calls([dict(run_id=run.id, rollout_id="a", started_at=now)], [], number=True)
    batch = [dict(run_id=run.id, rollout_id=r, started_at=now) for r in ("a", "b", "a", "b", "a")]
    ids = await astore.write_calls(batch, [(first[0], {"status": "ok", "finish_reason": "stop"})], number=True)
    await astore.close()
    by_id = {c.id: c for c in store.list_calls(run_id=run.id)}
    assert [by_id[i].seq for i in ids] == [1, 0, 2, 1, 3]
    assert (by_id[first[0]].seq, by_id[first[0]].status, by_id[first[0]].finish_reason) == (0, "ok", "stop")


def test_json_columns_hold_lists_and_dicts_that_sqlite_can_query(store: Store) -> None:
    run = store.create_run(config={"trainer": {"lr": 1e-4}, "nested": [1, {"k": None}]})
    body = '{"model": "m",  "messages": []}'  # a request body is stored as the client sent it
    call = store.add_call(Call(run_id=run.id, rollout_id="r", request_json=body, prompt_ids=[7, 8, 9],
                               logprobs=[-0.5, float("nan"), float("-inf")],
                               tool_calls_json=[{"name": "sh", "arguments": {"cmd": "ls \ud800"}}]))
    con = sqlite3.connect(store.path)
    assert con.execute("SELECT json_extract(prompt_ids, '$[1]'), json_extract(config_json, '$.trainer.lr') "
                       "FROM call JOIN run ON run.id = call.run_id").fetchone() == (8, 1e-4)
    assert con.execute("SELECT request_json, logprobs FROM call").fetchone() == (body, "[-0.5,null,null]")
    got = store.get_call(call.id)
    assert got.request_json == {"model": "m", "messages": []} and got.prompt_ids == [7, 8, 9]
    assert got.logprobs == [-0.5, None, None]  # NaN and infinities are JSON's null, never invalid `NaN`
    assert got.tool_calls_json[0]["arguments"]["cmd"] == "ls \ud800"  # a lone surrogate survives
    assert store.get_run(run.id).config_json["nested"] == [1, {"k": None}]
    con.execute("UPDATE call SET response_json = '{broken' WHERE id = ?", (call.id,))
    con.commit()
    with pytest.raises(StoreError, match="not JSON"):
        store.get_call(call.id)
    con.execute("UPDATE call SET response_json = '[NaN, 1]' WHERE id = ?", (call.id,))  # json.dumps' old output
    con.commit()
    assert store.get_call(call.id).response_json[1] == 1
    con.close()


def test_a_key_works_only_for_a_live_rollout_of_a_live_run(store: Store) -> None:
    run = store.create_run(owner_pid=os.getpid())
    live = store.create_rollout(run_id=run.id, task_id="t", status="running")
    done = store.create_rollout(run_id=run.id, task_id="t")
    store.update_rollout(done.id, status="scored", reward=1.0)
    assert store.rollout_by_key(live.key).id == live.id and store.rollout_by_key(done.key) is None
    store.set_run_status(run.id, "stopped")
    assert store.rollout_by_key(live.key) is None  # the run ended: its rollouts' keys die with it


async def test_recover_interrupts_a_dead_owners_run_and_its_keys(store: Store) -> None:
    dead, mine, alive = (store.create_run(owner_pid=pid) for pid in (999_999_999, os.getpid(), 4242))
    rollouts = {r.id: store.create_rollout(run_id=r.id, task_id="t", status="running") for r in (dead, mine, alive)}
    for i, run in enumerate((dead, mine, alive)):
        store.add_call(Call(run_id=run.id, rollout_id=rollouts[run.id].id, seq=i, status="in_flight"))
    astore = AsyncStore(store.path)
    assert await astore.rollout_by_key(rollouts[dead.id].key) is not None  # until someone notices
    got = store.recover(alive=lambda pid: pid != 999_999_999)
    assert got.runs == [dead.id] and got.calls == 2  # the dead run's call, and this process's own
    assert store.get_run(dead.id).status == "interrupted" and store.get_run(alive.id).status == "created"
    assert await astore.rollout_by_key(rollouts[dead.id].key) is None
    assert await astore.rollout_by_key(rollouts[mine.id].key) is not None
    status = {c.run_id: c.status for c in store.list_calls()}
    assert status == {dead.id: "interrupted", mine.id: "interrupted", alive.id: "in_flight"}
    await astore.close()


def test_an_empty_store_file_is_reported_not_replaced(tmp_path: Path) -> None:
    path = tmp_path / "forge.db"
    path.touch()
    with pytest.raises(StoreError, match=r"is empty \(0 bytes\): move it aside"):
        Store(path)
    with pytest.raises(StoreError, match="is empty"):
        AsyncStore(path)
    assert path.stat().st_size == 0  # left as it was


def test_updates_are_typed_patches(store: Store) -> None:
    run = store.create_run()
    ro = store.create_rollout(run_id=run.id, task_id="t")
    with pytest.raises(TypeError, match="RolloutPatch has no field.*rewrd"):
        store.update_rollout(ro.id, rewrd=1.0)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="RunPatch has no field.*key_hash"):
        store.update_run(run.id, key_hash="x")  # type: ignore[call-arg]
    store.update_run(run.id, summary={"pass": 1}, isolation="bwrap")
    store.update_rollout(ro.id, status="failed", failure_kind="infra", error="sandbox died")
    got_run, got_ro = store.get_run(run.id), store.get_rollout(ro.id)
    assert (got_run.summary_json, got_run.isolation) == ({"pass": 1}, "bwrap")
    assert (got_ro.failure_kind, got_ro.ended_at is not None) == ("infra", True)


def test_a_schema_4_store_gets_the_teacher_call_columns(tmp_path: Path) -> None:
    """Schema 5 adds call.retokenized and call.upstream_retries; the calls already there are the engine's."""
    path = tmp_path / "forge.db"
    _store_at_schema(path, 4)
    s = Store(path)
    assert s.schema_version() == store_mod.SCHEMA_VERSION and s.integrity_check() == "ok"
    old = s.list_calls(run_id="run-20261201-aaaaaaaaaa")
    assert old and {(c.retokenized, c.upstream_retries) for c in old} == {(False, 0)}


def test_a_schema_5_store_gets_the_judgement_table(tmp_path: Path) -> None:
    """Schema 6 adds the `judgement` table (one row per judge call), empty on an old store."""
    from openforge.store import Judgement

    path = tmp_path / "forge.db"
    _store_at_schema(path, 5)
    s = Store(path)
    assert s.schema_version() == store_mod.SCHEMA_VERSION and s.integrity_check() == "ok"
    assert s.list_judgements(run_id="run-20261201-aaaaaaaaaa") == []
    s.add_judgement(Judgement(run_id="r", rollout_id="ro", prompt_json=[{"role": "user", "content": "x"}],
                              reply="VERDICT: PASS", score=1.0))
    [row] = s.list_judgements(rollout_id="ro")
    assert (row.prompt_json, row.score, row.error) == ([{"role": "user", "content": "x"}], 1.0, None)


def test_a_schema_6_store_gets_the_call_roles(tmp_path: Path) -> None:
    """Schema 7 adds call.policy_turns and call.side (issue 44); an old call is a main call, its turns unknown."""
    path = tmp_path / "forge.db"
    _store_at_schema(path, 6)
    s = Store(path)
    assert s.schema_version() == store_mod.SCHEMA_VERSION and s.integrity_check() == "ok"
    old = s.list_calls(run_id="run-20261201-aaaaaaaaaa")
    assert old and {(c.policy_turns, c.side) for c in old} == {(None, None)}


def test_a_schema_7_store_gets_the_policy_versions(tmp_path: Path) -> None:
    """Schema 8 adds run.policy_version and rollout.policy_version (issue 47): an old rollout's version is
    unknown; a new one records its run's when created for the run's current adapter, and none for another."""
    path = tmp_path / "forge.db"
    _store_at_schema(path, 7)
    s = Store(path)
    assert s.schema_version() == 8 and s.integrity_check() == "ok"
    run_id = "run-20261201-aaaaaaaaaa"
    old = s.list_rollouts(run_id)
    assert old and {r.policy_version for r in old} == {None} and s.get_run(run_id).policy_version is None
    s.update_run(run_id, current_adapter=f"{run_id}-step-2", policy_version=3)
    new = s.create_rollout(run_id=run_id, task_id="t", adapter=f"{run_id}-step-2")
    older = s.create_rollout(run_id=run_id, task_id="t", adapter=f"{run_id}-step-1")
    assert (s.get_rollout(new.id).policy_version, s.get_rollout(older.id).policy_version) == (3, None)
