"""The store on PostgreSQL: a real server (tests/pgserver.py, one per test session of this module, a
fresh database per test) under the same store, recorder and fault tests as SQLite, plus what only
PostgreSQL has: its json columns, migrations under an advisory lock, its integrity checks, its
errors as one line, and many proxy workers on one server with one of them killed mid-load.

The shared tests are imported from their modules and run here again with `store` a PostgreSQL store
(the fixture below overrides conftest's for this module only). They are the backend-neutral ones;
those that read the SQLite file itself (WAL, raw bytes, the file's locks) stay SQLite's.

Without PostgreSQL's server binaries the module skips and says so, unless FORGE_REQUIRE names
postgres (CI sets FORGE_REQUIRE: there the binaries must be present; tests/helpers/required.py).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests import pgserver
from openforge import db, migrations
from openforge.async_store import AsyncStore
from openforge.errors import StoreError
from openforge.store import Call, Store

# The shared tests, run again on PostgreSQL (see the module's docstring).
from tests.e2e.test_faults import test_proxy_killed_with_50_calls_in_flight_loses_no_answered_call  # noqa: F401
from tests.proxy.test_proxy_robust import (  # noqa: F401
    test_a_crashed_runs_keys_stop_working_when_a_proxy_starts,
    test_concurrent_calls_share_commits,
    test_restart_interrupts_stale_calls_and_keeps_reusing_tokens,
)
from tests.helpers.proxy_rig import make_rig  # noqa: F401 - fixture
from tests.helpers.required import skip_or_fail
from tests.proxy.test_proxy_workers import test_a_rollout_alternating_between_two_workers_keeps_exact_tokens  # noqa: F401
from tests.core.test_store import (  # noqa: F401
    test_a_key_works_only_for_a_live_rollout_of_a_live_run,
    test_async_store_updates_and_key_lookup,
    test_concurrent_async_writers_lose_no_rows,
    test_every_table_round_trips,
    test_insert_calls_with_mixed_columns_keeps_order,
    test_recover_interrupts_a_dead_owners_run_and_its_keys,
    test_two_writer_processes_never_number_a_call_twice,
    test_unknown_ids_are_clear_errors,
    test_updates_are_typed_patches,
    test_write_calls_numbers_each_rollouts_calls_in_one_transaction,
)

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def pg() -> Iterator[pgserver.PgServer]:
    import importlib.util

    try:
        missing = [m for m in ("psycopg", "asyncpg") if importlib.util.find_spec(m) is None]
        if missing:
            raise FileNotFoundError(f"the [postgres] extra is not installed ({', '.join(missing)} missing): "
                                    "pip install -e '.[postgres]'")
        server = pgserver.start()
    except FileNotFoundError as exc:
        skip_or_fail("postgres", str(exc))
    yield server
    server.stop()


@pytest.fixture(params=["postgresql"])
def store(request: pytest.FixtureRequest, forge_home: Path) -> Iterator[Store]:
    """A PostgreSQL store (a fresh database) here; `sqlite` where a test asks for both."""
    if request.param == "sqlite":
        s = Store(forge_home / "forge.db")
    else:
        s = Store(request.getfixturevalue("pg").create_db())
    yield s
    s.close()


def test_a_postgres_store_is_stamped_and_its_json_columns_keep_the_text(store: Store) -> None:
    import psycopg

    assert store.postgres and store.schema_version() == migrations.MIGRATIONS[-1][0]
    assert store.integrity_check() == "ok"
    run = store.create_run(config={"trainer": {"lr": 1e-4}})
    body = '{"model": "m",  "messages": []}'  # a request body is kept as the client sent it
    call = store.add_call(Call(run_id=run.id, rollout_id="r", request_json=body, prompt_ids=[7, 8, 9],
                               logprobs=[-0.5, float("nan"), float("-inf")]))
    with psycopg.connect(store.path.replace("+asyncpg", "")) as con:
        types = dict(con.execute("SELECT column_name, data_type FROM information_schema.columns "
                                 "WHERE table_name = 'call'").fetchall())
        assert types["prompt_ids"] == types["request_json"] == "json"
        row = con.execute("SELECT request_json::text, logprobs::text, prompt_ids->>1, "
                          "(SELECT config_json->'trainer'->>'lr' FROM run) FROM call").fetchone()
    assert row == (body, "[-0.5,null,null]", "8", "0.0001")
    got = store.get_call(call.id)
    assert got.request_json == {"model": "m", "messages": []} and got.logprobs == [-0.5, None, None]


def test_migrations_run_once_on_postgres_and_a_newer_or_foreign_database_is_refused(
        pg: pgserver.PgServer, monkeypatch: pytest.MonkeyPatch) -> None:
    url = pg.create_db()
    Store(url).close()
    added = migrations.MIGRATIONS + [
        (99, "rollout.cost", lambda c: c.exec_driver_sql("ALTER TABLE rollout ADD COLUMN cost FLOAT"))]
    monkeypatch.setattr(migrations, "MIGRATIONS", added)
    s = Store(url)
    s.close()
    s = Store(url)  # twice: the second open finds nothing to do
    with s.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM schema_migrations WHERE version = 99").scalar() == 1
        assert conn.exec_driver_sql("SELECT cost FROM rollout").all() == []
    s.close()
    monkeypatch.setattr(migrations, "MIGRATIONS", added[:-1])
    with pytest.raises(StoreError, match="schema version 99, newer than this forge knows"):
        Store(url)

    import psycopg

    foreign = pg.create_db()
    with psycopg.connect(foreign.replace("+asyncpg", ""), autocommit=True) as con:
        con.execute("CREATE TABLE orders (id int)")
    with pytest.raises(StoreError, match="is a PostgreSQL database but not an OpenForge store"):
        Store(foreign)


def test_integrity_check_finds_a_call_numbered_twice(store: Store) -> None:
    import psycopg

    run = store.create_run()
    store.add_call(Call(run_id=run.id, rollout_id="r", seq=0))
    store.add_call(Call(run_id=run.id, rollout_id="r", seq=1))
    assert store.integrity_check() == "ok"
    with psycopg.connect(store.path.replace("+asyncpg", ""), autocommit=True) as con:
        con.execute("DROP INDEX ix_call_rollout_seq")  # what a damaged or hand-edited store may look like
        con.execute("UPDATE call SET seq = 0")
    assert store.integrity_check() == "1 call numbers given twice within a rollout"


def test_an_unreachable_server_or_a_missing_driver_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql+asyncpg://forge:s3cret@127.0.0.1:{port}/forge"
    with pytest.raises(StoreError) as err:
        Store(url)
    msg = str(err.value)
    assert msg.startswith(f"cannot reach the PostgreSQL store at 127.0.0.1:{port}/forge") and "\n" not in msg
    assert "s3cret" not in msg and db.redact(url) == f"postgresql+asyncpg://forge:***@127.0.0.1:{port}/forge"
    with pytest.raises(StoreError, match="store.url .*only PostgreSQL URLs"):
        Store("mysql://u@h/db")

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "psycopg" else real(name, *a))
    with pytest.raises(StoreError, match=r"needs the psycopg driver: pip install 'openforge\[postgres\]'"):
        Store(url)


def test_forge_runs_reads_a_postgres_store_from_config(pg: pgserver.PgServer, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    url = pg.create_db()
    s = Store(url)
    run = s.create_run(name="on-postgres")
    s.close()
    (tmp_path / "forge.toml").write_text(f'[store]\nurl = "{url}"\n')
    # A process of its own: Rich sizes its table from COLUMNS when its console is made, and an
    # in-process console may have been made (80 columns wide, the run id cut) by an earlier test.
    res = subprocess.run([sys.executable, "-m", "openforge.forge_cli.main", "--home", str(tmp_path / "home"), "--config",
                          str(tmp_path / "forge.toml"), "runs"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "200"})
    output = res.stdout + res.stderr
    assert res.returncode == 0, output
    assert f"runs in {url}" in output and run.id in output and "on-postgres" in output
    assert not (tmp_path / "home" / "forge.db").exists()


@pytest.mark.slow
@pytest.mark.parametrize("store", ["sqlite", "postgresql"], indirect=True)
def test_kill_9_of_a_worker_mid_load_loses_no_answered_call(make_rig, store: Store) -> None:
    """Two proxy workers on one store, six clients calling without pause; one worker is killed with
    SIGKILL mid-load. Every call that got its 200 is an `ok` row, each rollout's calls are numbered
    0..n-1 with no hole or repeat (the numbering is shared by the workers through the store), and
    the store passes its backend's integrity check."""
    rig = make_rig(lambda ids: "ok", workers=2)
    run_id = rig.rollout.run_id
    rollouts = [rig.rollout] + [store.create_rollout(run_id=run_id, task_id="t", status="running") for _ in range(2)]
    workers = rig.proxy._workers
    victim = workers.procs[0]
    answered: list[str] = []  # the ids of the answers a client received
    lock = threading.Lock()
    stop = threading.Event()

    def client(i: int) -> None:
        key = rollouts[i % len(rollouts)].key
        n = 0
        while not stop.is_set():
            n += 1
            try:
                with httpx.Client(base_url=rig.url, timeout=60, headers={"authorization": f"Bearer {key}"}) as http:
                    resp = http.post("/v1/chat/completions", json={"model": "m", "messages": [
                        {"role": "user", "content": f"client {i} call {n}"}]})
            except httpx.TransportError:  # a connection the dying worker had accepted
                continue
            if resp.status_code == 200:
                with lock:
                    answered.append(resp.json()["id"])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 120
        while len(answered) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(answered) >= 20, "the load never got going"
        os.kill(victim.pid, signal.SIGKILL)
        at_kill = len(answered)
        while len(answered) < at_kill + 20 and time.monotonic() < deadline + 60:
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    assert len(answered) >= at_kill + 20, "the surviving worker must go on serving"
    rows = [c for c in store.list_calls(run_id=run_id)]
    ok_ids = {c.response_json["id"] for c in rows if c.status == "ok"}
    assert set(answered) <= ok_ids and len(answered) == len(set(answered))  # no answer lost, none twice
    # A call's row is committed before its last byte is sent (proxy/pipeline.py), so the victim may have
    # recorded an answer and died before its client read it: at most one such call per client.
    assert len(ok_ids - set(answered)) <= len(threads), ok_ids - set(answered)
    for ro in rollouts:
        seqs = [c.seq for c in rows if c.rollout_id == ro.id]
        assert sorted(seqs) == list(range(len(seqs)))
    assert store.integrity_check() == "ok"


def test_doctor_says_whether_the_postgres_store_is_reachable(pg: pgserver.PgServer, tmp_path: Path) -> None:
    from openforge.config import ForgeConfig
    from openforge.runs.checks import check_store

    url = pg.create_db()
    got = check_store(ForgeConfig.model_validate({"store": {"url": url}}), tmp_path)
    assert (got.verdict, got.detail) == ("ok", f"PostgreSQL {url}, schema version {migrations.MIGRATIONS[-1][0]}")
    gone = url.replace(f":{pg.port}/", ":1/")  # nothing listens on port 1
    got = check_store(ForgeConfig.model_validate({"store": {"url": gone}}), tmp_path)
    assert got.verdict == "missing" and got.detail.startswith("cannot reach the PostgreSQL store at 127.0.0.1:1/")
    assert check_store(ForgeConfig(), tmp_path).detail.startswith("SQLite file")
