"""Opening a store: the SQLAlchemy engine, the connection settings, the database's errors as
one clear line. `Store` and `AsyncStore` both open the store through here.

A store is an SQLite file (the embedded default: a path) or a PostgreSQL database (a URL,
`store.url = "postgresql+asyncpg://user@host/db"`, the `[postgres]` extra): many proxy workers and
machines on one store. The sync `Store` speaks to PostgreSQL through psycopg 3, the proxy's
`AsyncStore` through asyncpg; either spelling of the URL (`postgresql://`, `+asyncpg`, `+psycopg`)
names the same database.
"""

from __future__ import annotations

import re
import sqlite3
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine

from openforge.errors import StoreError

BUSY_TIMEOUT_S = 10


PG_SCHEMES = ("postgresql", "postgres")
# Seconds to wait for a PostgreSQL server to accept a connection before saying it is unreachable.
PG_CONNECT_TIMEOUT_S = 10


def is_url(location: str | Path) -> bool:
    """Whether a store location is a database URL (PostgreSQL) rather than an SQLite file path."""
    return isinstance(location, str) and "://" in location


def location(value: str | Path) -> str | Path:
    """A store location as given: a URL stays a string (Path() would fold its `//`), a path a Path."""
    return value if is_url(value) else Path(value)


def pg_url(url: str, driver: str) -> str:
    """`url` with SQLAlchemy's driver `driver` (psycopg | asyncpg); refuses other databases."""
    scheme, sep, rest = url.partition("://")
    base = scheme.split("+", 1)[0]
    if base not in PG_SCHEMES:
        raise StoreError(f"store.url {redact(url)!r}: only PostgreSQL URLs are supported "
                         "(postgresql+asyncpg://user@host/db); leave it empty for the SQLite file")
    return f"postgresql+{driver}{sep}{rest}"


def redact(url: str | Path) -> str:
    """A location fit for messages and logs: a URL's password replaced by ***."""
    if not is_url(url):
        return str(url)
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", str(url))


def pg_server(url: str) -> str:
    """host:port/db of a PostgreSQL URL, for messages."""
    parts = urlsplit(str(url))
    return f"{parts.hostname or 'localhost'}:{parts.port or 5432}{parts.path or '/'}"


def need_driver(module: str) -> None:
    """Refuse, in one line, a PostgreSQL store without its driver installed."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise StoreError(f"a PostgreSQL store needs the {module} driver: pip install 'openforge[postgres]' "
                         "(psycopg for the CLI and trainer, asyncpg for the proxy)")


def _pg_error(exc: BaseException, url: str) -> StoreError:
    orig = getattr(exc, "orig", None) or exc
    msg = " ".join(str(orig).split())  # libpq's messages span lines
    where = pg_server(url)
    low = msg.lower()
    if isinstance(orig, (ConnectionError, TimeoutError, OSError)) or any(s in low for s in (
            "connection refused", "could not connect", "connection failed", "timeout expired",
            "name or service not known", "could not translate host", "no such file or directory",
            "server closed the connection", "connection is closed", "terminating connection")):
        return StoreError(f"cannot reach the PostgreSQL store at {where} ({msg[:160]}); is the server "
                          "running, and store.url right?")
    if "password authentication failed" in low or "authentication" in low or "role" in low and "does not exist" in low:
        return StoreError(f"PostgreSQL refused the login to {where} ({msg[:160]}); check the user and "
                          "password in store.url (or PGPASSWORD)")
    if "database" in low and "does not exist" in low:
        return StoreError(f"the PostgreSQL store {where} does not exist: create it (createdb) and retry")
    if "could not extend" in low or "no space left" in low or "disk full" in low:
        return StoreError(f"no space left for the PostgreSQL store {where}; free disk space on the server and retry")
    return StoreError(f"PostgreSQL store {where}: {msg[:300]}")


def store_error(exc: BaseException, path: str | Path) -> StoreError:
    """An SQLite or PostgreSQL (or SQLAlchemy-wrapped) error as the one line a user sees."""
    if is_url(path):
        return _pg_error(exc, str(path))
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


def _on_pg_connect(dbapi_conn: Any, _record: Any) -> None:
    import orjson
    from psycopg.types.json import set_json_loads

    set_json_loads(orjson.loads, dbapi_conn)  # json columns: ~10x json.loads on a 2,048-id list


def sync_engine(path: str | Path) -> Engine:
    if is_url(path):
        need_driver("psycopg")
        # UTC sessions: the tables' timestamps are naive UTC, as SQLite's are.
        eng = create_engine(pg_url(str(path), "psycopg"), pool_pre_ping=True,
                            connect_args={"connect_timeout": PG_CONNECT_TIMEOUT_S, "options": "-c timezone=UTC"})
        event.listen(eng, "connect", _on_pg_connect)
        return eng
    eng = create_engine(f"sqlite:///{path}",
                        connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_S})
    event.listen(eng, "connect", _on_connect)
    return eng


def point_reader(path: Path) -> sqlite3.Connection:
    """A read-only connection for single indexed reads done inline (microseconds in WAL mode, never
    blocked by a writer): cheaper than a hop to another thread on every request."""
    conn = sqlite3.connect(path, check_same_thread=False, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    conn.execute("PRAGMA query_only = ON")
    return conn
