"""openforge/tables.py: the store's tables and their JSON columns (valid JSON a person's `sqlite3` reads), ids and
credentials (only a key's hash is kept)."""

from __future__ import annotations

import json
import math
import re
import sqlite3

import pytest

from openforge.errors import StoreError
from openforge.store import Store
from openforge.tables import (JUDGE_KEY_PREFIX, Call, decode_json, encode_json, hash_key, new_id, new_judge_key,
                              new_rollout_key)


def test_json_columns_hold_valid_json_and_read_back_older_rows() -> None:
    assert json.loads(encode_json({"logprobs": [math.nan, -math.inf, -0.5]})) == {"logprobs": [None, None, -0.5]}
    assert encode_json('{"as": "sent"}') == '{"as": "sent"}'  # a request body's text is kept exactly
    assert encode_json({1: "a"}) == '{"1":"a"}'
    assert encode_json([2 ** 70]) == f"[{2 ** 70}]"  # past orjson's 64 bits: json writes it
    assert math.isnan(decode_json("[NaN]")[0])  # rows written before orjson
    with pytest.raises(StoreError, match="not JSON"):
        decode_json("{oops")


def test_a_json_column_is_text_sqlite_reads_with_its_json_functions(store: Store) -> None:
    run = store.create_run()
    store.add_call(Call(run_id=run.id, rollout_id="r", seq=0, status="ok", logprobs=[-0.25, math.nan]))
    with sqlite3.connect(store.path) as db:
        row = db.execute("select json_extract(logprobs, '$[0]'), json_type(logprobs, '$[1]') from call").fetchone()
    assert row == (-0.25, "null")


def test_ids_and_keys() -> None:
    assert re.fullmatch(r"run-\d{8}-[0-9a-f]{10}", new_id("run"))
    assert new_id("ro") != new_id("ro")
    key, judge = new_rollout_key(), new_judge_key()
    assert key.startswith("forge-") and judge.startswith(JUDGE_KEY_PREFIX) and len(key) > 30
    assert hash_key(key) == hash_key(key) != hash_key(judge) and len(hash_key(key)) == 64 and key not in hash_key(key)


def test_a_rollouts_plain_key_lives_on_the_returned_object_only(store: Store) -> None:
    run = store.create_run()
    ro = store.create_rollout(run_id=run.id, task_id="t")
    assert ro.key is not None and ro.key_hash == hash_key(ro.key)
    assert store.get_rollout(ro.id).key is None  # read back: the hash alone
