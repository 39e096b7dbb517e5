"""A throwaway PostgreSQL server for the tests and benches: its own data dir in a temp dir, on
127.0.0.1 at a free port (and a unix socket in that dir), trust auth, stopped at the end.

initdb and postgres refuse to run as root: as root, the server runs as the `postgres` user (Debian's
package makes it) or `nobody`. `fast=True` turns fsync off (tests: the server itself is never
killed); the benches keep PostgreSQL's defaults.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path


def pg_bin() -> Path | None:
    """The folder holding initdb and pg_ctl (Debian keeps them out of PATH), or None."""
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True):
        if Path(folder, "initdb").is_file() and Path(folder, "pg_ctl").is_file():
            return Path(folder)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PgServer:
    bindir: Path
    root: Path
    port: int
    user: str | None  # the OS user the server runs as (None: this one)

    @property
    def admin_url(self) -> str:
        return f"postgresql://forge@127.0.0.1:{self.port}/postgres"

    def url(self, db: str) -> str:
        return f"postgresql+asyncpg://forge@127.0.0.1:{self.port}/{db}"

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)

    def create_db(self, prefix: str = "forge") -> str:
        """A fresh, empty database; returns its asyncpg URL."""
        import psycopg

        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=30) as conn:
            conn.execute(f"CREATE DATABASE {name} TEMPLATE template0 STRATEGY FILE_COPY")
        return self.url(name)

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "-w", "-t", "60", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


def start(*, fast: bool = True) -> PgServer:
    bindir = pg_bin()
    if bindir is None:
        raise FileNotFoundError("PostgreSQL's server binaries (initdb, pg_ctl) are not installed: "
                                "apt-get install postgresql")
    user = None
    if os.geteuid() == 0:
        import pwd

        for name in ("postgres", "nobody"):
            try:
                pwd.getpwnam(name)
                user = name
                break
            except KeyError:
                continue
    root = Path(tempfile.mkdtemp(prefix="forge-pg-"))
    if user:
        shutil.chown(root, user)
    os.chmod(root, 0o700)
    server = PgServer(bindir, root, _free_port(), user)
    init = server._run("initdb", "-D", str(root / "data"), "-U", "forge", "--auth=trust", "-E", "UTF8",
                       "--no-sync", "--no-instructions")
    if init.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"initdb failed: {init.stderr.strip()[-500:]}")
    opts = [f"-p {server.port}", "-c listen_addresses=127.0.0.1", f"-c unix_socket_directories={root}",
            "-c max_connections=200", "-c shared_buffers=64MB"]
    if fast:
        opts += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
    run = server._run("pg_ctl", "-D", str(root / "data"), "-l", str(root / "log"), "-o", " ".join(opts),
                      "-w", "-t", "90", "start", timeout=120)
    if run.returncode != 0:
        log = (root / "log").read_text(errors="replace")[-800:] if (root / "log").exists() else ""
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"PostgreSQL did not start: {run.stderr.strip()[-300:]} {log}")
    return server
