"""Room for the last writes of a run on a full disk: a reserve file beside the store.

A run that ends because its disk filled up (or is stopped, by SIGTERM, while it is full) still has to
say so in the store: the run `stopped` or `failed` with the reason, its rollouts no longer running.
SQLite needs free pages for that (WAL frames), and a full disk has none. So a run holds a reserve:
`forge.db.reserve`, 1 MiB of allocated blocks beside the store, made when the run starts. A final
write that fails for want of space deletes the reserve and tries once more:

    hold(store.path)                                   # at the start of a run (best effort)
    write_despite_full_disk(store.path, lambda: store.set_run_status(run_id, "stopped"))
    release(store.path)                                # at its end: the space goes back

One reserve per store, shared by the processes writing it: whoever needs it first spends it.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from openforge.db import is_url
from openforge.errors import StoreError

log = logging.getLogger(__name__)

RESERVE_BYTES = 1 << 20  # 64 WAL frames of 16 KiB pages: a run's and its rollouts' final status rows
T = TypeVar("T")


def reserve_path(db_path: str | Path) -> Path:
    db_path = Path(db_path)
    return db_path.with_name(db_path.name + ".reserve")


def hold(db_path: str | Path, size: int = RESERVE_BYTES) -> bool:
    """Make the reserve (allocated blocks, not a sparse file) unless it exists; False if there is no room
    (or the store is a PostgreSQL database: the server's disk is not ours to reserve)."""
    if is_url(db_path):
        return False
    path = reserve_path(db_path)
    try:
        if path.stat().st_size >= size:
            return True
    except FileNotFoundError:
        pass
    except OSError:
        return False
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    except OSError as exc:
        log.warning("no disk reserve for the run store (%s): a full disk may keep a run from recording "
                    "its end", exc.strerror)
        return False
    try:
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno != errno.EOPNOTSUPP:  # a filesystem without fallocate: write the zeros
                raise
            os.pwrite(fd, b"\0" * size, 0)
        os.fsync(fd)
    except OSError as exc:
        os.close(fd)
        _unlink(path)
        log.warning("no disk reserve for the run store (%s): a full disk may keep a run from recording "
                    "its end", exc.strerror)
        return False
    os.close(fd)
    return True


def release(db_path: str | Path) -> bool:
    """Give the reserve's space back; True if there was one."""
    if is_url(db_path):
        return False
    return _unlink(reserve_path(db_path))


def is_disk_full(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "no space left" in text or "disk is full" in text


def write_despite_full_disk(db_path: str | Path, write: Callable[[], T]) -> T:
    """`write()`; if it fails for want of disk space, release the reserve and call it once more."""
    try:
        return write()
    except (StoreError, OSError) as exc:
        if not is_disk_full(exc) or not release(db_path):
            raise
        log.warning("the disk is full: the run store's reserve was spent on recording the run's end")
        return write()


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False
    except OSError:
        return False
