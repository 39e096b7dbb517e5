"""Opening a store file: the engines (sync and async), the connection settings, SQLite's errors as
one clear line. `Store` and `AsyncStore` both open the file through here.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from openforge.errors import StoreError

BUSY_TIMEOUT_S = 10


def store_error(exc: BaseException, path: Path) -> StoreError:
    """An SQLite (or SQLAlchemy-wrapped) error as the one line a user sees."""
    msg = str(getattr(exc, "orig", None) or exc)
    if "locked" in msg or "busy" in msg:
        return StoreError(f"the run store {path} is locked by another process; retry, or stop that process")
    if "disk is full" in msg or "database or disk is full" in msg or "No space left" in msg:
        return StoreError(f"no space left for the run store {path}; free disk space and retry")
    if "malformed" in msg or "not a database" in msg:
        return StoreError(f"the run store {path} is damaged ({msg}); move it aside to start a new one")
    if "readonly" in msg or "unable to open" in msg:
        return StoreError(f"cannot write the run store {path} ({msg}); check its permissions")
    return StoreError(f"run store {path}: {msg}")


def check_file(path: Path) -> None:
    """Refuse a 0-byte store file: SQLite would take it for a new database and the user's runs would
    seem gone. A store this code creates is never empty for longer than the instant between the
    file's creation and its first write, so a file still empty after a moment is the user's problem."""
    for _ in range(10):
        try:
            if path.stat().st_size > 0:
                return
        except FileNotFoundError:
            return
        time.sleep(0.05)
    raise StoreError(f"the run store {path} is empty (0 bytes): move it aside (or delete it) to start "
                     "a new store, or restore it from a backup")


def _on_connect(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    # A new file gets 16 KiB pages: a call row (~25 KB of token ids and bodies) then spans two
    # overflow pages instead of seven. Ignored on an existing file.
    cur.execute("PRAGMA page_size=16384")
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")  # durable at checkpoints; WAL keeps it consistent
    cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_S * 1000}")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def sync_engine(path: Path) -> Engine:
    eng = create_engine(f"sqlite:///{path}",
                        connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_S})
    event.listen(eng, "connect", _on_connect)
    return eng


def async_engine(path: Path) -> AsyncEngine:
    eng = create_async_engine(f"sqlite+aiosqlite:///{path}", connect_args={"timeout": BUSY_TIMEOUT_S})
    event.listen(eng.sync_engine, "connect", _on_connect)
    return eng


def point_reader(path: Path) -> sqlite3.Connection:
    """A read-only connection for single indexed reads done inline (microseconds in WAL mode, never
    blocked by a writer): cheaper than a hop to aiosqlite's thread on every request."""
    conn = sqlite3.connect(path, check_same_thread=False, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    conn.execute("PRAGMA query_only = ON")
    return conn
