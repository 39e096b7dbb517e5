"""openforge/reserve.py: a run's last writes on a full disk spend a reserve file held beside the store."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from openforge.errors import StoreError
from openforge.reserve import RESERVE_BYTES, hold, release, reserve_path, write_despite_full_disk


def _full_once(calls: list[str]):
    def write() -> str:
        calls.append("write")
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return "recorded"
    return write


def test_the_reserve_is_allocated_beside_the_store_and_given_back(tmp_path: Path) -> None:
    db = tmp_path / "forge.db"
    assert hold(db)
    reserve = reserve_path(db)
    assert reserve == tmp_path / "forge.db.reserve"
    assert reserve.stat().st_size == RESERVE_BYTES
    assert reserve.stat().st_blocks * 512 >= RESERVE_BYTES  # allocated blocks, not a sparse file
    assert hold(db)  # already held: kept
    assert release(db) and not reserve.exists()
    assert not release(db)  # nothing left to give back


def test_a_write_that_finds_the_disk_full_spends_the_reserve_and_runs_once_more(tmp_path: Path) -> None:
    db = tmp_path / "forge.db"
    hold(db)
    calls: list[str] = []
    assert write_despite_full_disk(db, _full_once(calls)) == "recorded"
    assert calls == ["write", "write"] and not reserve_path(db).exists()


def test_without_a_reserve_or_for_another_error_the_write_fails_as_it_did(tmp_path: Path) -> None:
    db = tmp_path / "forge.db"
    with pytest.raises(OSError, match="No space left"):  # no reserve to spend
        write_despite_full_disk(db, _full_once([]))
    hold(db)

    def locked() -> None:
        raise StoreError("database is locked")

    with pytest.raises(StoreError, match="locked"):
        write_despite_full_disk(db, locked)
    assert reserve_path(db).exists()  # not spent on an error it cannot help


def test_a_postgresql_store_holds_no_reserve() -> None:
    assert not hold("postgresql://forge@db/forge") and not release("postgresql://forge@db/forge")
