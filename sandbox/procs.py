"""Process containment for the local backend: resource limits, cgroups, and killing a whole tree.

Limits, and why each is set the way it is:

- CPU time: `RLIMIT_CPU` per process (SIGXCPU, then SIGKILL at the hard limit).
- File size: `RLIMIT_FSIZE`: a write past it fails with SIGXFSZ/EFBIG, so a disk-filler stops.
- Cores (`sandbox.cpus`, a task's `limits.cpus`): CPU affinity, inherited by every child; `nproc` and
  thread pools sized by `sched_getaffinity` see the task's count.
- Memory and process count: a cgroup per sandbox (`memory.limit_in_bytes`, `pids.max`) where this
  process may create one (root on cgroup v1, or a delegated v2 subtree). That is the only exact
  answer: `RLIMIT_NPROC` counts *all* processes of the real uid, not of one sandbox, and is not
  enforced at all for root; `RLIMIT_AS` counts reserved address space, which node/V8 and Go reserve
  by the gigabyte. Without a cgroup we fall back to `RLIMIT_DATA` (private writable memory, close to
  what "memory" means and harmless to big reservations) and to `RLIMIT_NPROC` set to the uid's
  current process count plus the sandbox's budget (an approximation, and a no-op for root).

Every sandboxed process also carries `OPENFORGE_SANDBOX=<id>` (and `OPENFORGE_EXEC=<id>` per exec) in
its environment: a process that left our process group with setsid() is still found and killed.
"""

from __future__ import annotations

import os
import resource
import shlex
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PARENT = "openforge"


@dataclass
class Limits:
    cpu_time_s: int
    memory_mb: int
    max_processes: int
    max_file_mb: int
    cores: tuple[int, ...] = ()  # the CPUs the sandbox's processes may run on; () = all of ours


class Cgroup:
    """A v1 (pids + memory controllers) or v2 cgroup for one sandbox, or nothing where we cannot make one."""

    def __init__(self, name: str, limits: Limits) -> None:
        self.dirs: list[Path] = []
        v1 = CGROUP_ROOT / "pids" / "cgroup.procs"
        if v1.exists():
            targets = {"pids": {"pids.max": str(limits.max_processes)},
                       "memory": {"memory.limit_in_bytes": str(limits.memory_mb << 20)}}
            for ctrl, files in targets.items():
                self._make(CGROUP_ROOT / ctrl / CGROUP_PARENT / name, files)
        elif (CGROUP_ROOT / "cgroup.controllers").exists():
            parent = CGROUP_ROOT / CGROUP_PARENT
            try:
                parent.mkdir(exist_ok=True)
                (parent / "cgroup.subtree_control").write_text("+pids +memory")
            except OSError:
                return
            self._make(parent / name, {"pids.max": str(limits.max_processes),
                                       "memory.max": str(limits.memory_mb << 20)})

    def _make(self, path: Path, files: dict[str, str]) -> None:
        try:
            path.mkdir(parents=True, exist_ok=True)
            for fname, value in files.items():
                (path / fname).write_text(value)
        except OSError:
            return
        self.dirs.append(path)

    @property
    def limits_pids(self) -> bool:
        return any((d / "pids.max").exists() for d in self.dirs)

    @property
    def limits_memory(self) -> bool:
        return any((d / "memory.limit_in_bytes").exists() or (d / "memory.max").exists() for d in self.dirs)

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.dirs:
            try:
                found.update(int(x) for x in (d / "cgroup.procs").read_text().split())
            except OSError:
                pass
        return found

    def remove(self) -> None:
        for d in self.dirs:
            remove_cgroup_dir(d)
        self.dirs = []


def cgroup_name(sandbox_id: str) -> str:
    """`<sandbox id>.<owner pid>`: `forge gc` removes the cgroups of owners that died."""
    return f"{sandbox_id}.{os.getpid()}"


def orphan_cgroups() -> list[Path]:
    """Our cgroups whose owner process is gone (a crash between start and stop)."""
    parents = [CGROUP_ROOT / c / CGROUP_PARENT for c in ("pids", "memory")] + [CGROUP_ROOT / CGROUP_PARENT]
    found = []
    for parent in parents:
        for d in parent.iterdir() if parent.is_dir() else []:
            owner = d.name.rpartition(".")[2]
            if d.is_dir() and owner.isdigit() and not psutil.pid_exists(int(owner)):
                found.append(d)
    return found


def remove_cgroup_dir(path: Path) -> None:
    """Kill what is left in a cgroup and remove it (rmdir only succeeds once it is empty)."""
    for _ in range(50):
        try:
            pids = [int(x) for x in (path / "cgroup.procs").read_text().split()]
        except OSError:
            return
        for pid in pids:
            _kill(pid)
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:  # EBUSY: tasks still exiting leave the cgroup a moment after SIGKILL
            psutil.wait_procs(_procs(pids), timeout=0.05) if pids else time.sleep(0.02)


def nproc_budget(max_processes: int) -> int:
    """RLIMIT_NPROC counts every process of the real uid: the budget is on top of what runs now."""
    uid = os.getuid()
    return max_processes + sum(1 for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid)


def limit_argv(limits: Limits, cgroup_dirs: list[str], *, nproc: int | None, mem_fallback: bool) -> list[str] | None:
    """An argv prefix that joins the cgroups and sets the rlimits, then execs the command: `sh` writes
    its pid into each `cgroup.procs`, `prlimit` (util-linux) sets the limits and execs.

    A prefix rather than `preexec_fn`: without preexec_fn Python spawns with vfork, which matters
    when the caller is a trainer process with gigabytes mapped, and no Python runs between fork and
    exec (where a lock held by another thread could deadlock the child). None if prlimit is missing."""
    prlimit = shutil.which("prlimit")
    if not prlimit:
        return None
    size, cpu = limits.max_file_mb << 20, limits.cpu_time_s
    opts = [f"--cpu={cpu}:{cpu + 5}", f"--fsize={size}:{size}", "--core=0:0"]
    if mem_fallback:
        opts.append(f"--data={limits.memory_mb << 20}:{limits.memory_mb << 20}")
    if nproc is not None:
        opts.append(f"--nproc={nproc}:{nproc}")
    joins = "".join(f"echo $$ > {shlex.quote(os.path.join(d, 'cgroup.procs'))} || exit 125; " for d in cgroup_dirs)
    pin = ""
    if limits.cores:  # taskset is util-linux too; without it the preexec path pins
        taskset = shutil.which("taskset")
        if not taskset:
            return None
        pin = f"{shlex.quote(taskset)} --cpu-list {','.join(map(str, limits.cores))} "
    return ["/bin/sh", "-c", f'{joins}exec {pin}{shlex.quote(prlimit)} {" ".join(opts)} -- "$@"', "sh"]


def preexec(limits: Limits, cgroup_dirs: list[str], *, nproc: int | None, mem_fallback: bool):  # type: ignore[no-untyped-def]
    """The same as `limit_argv`, as a function run in the child between fork and exec (when there is
    no prlimit): only file writes and setrlimit, no locks, no logging."""
    procs_files = [os.path.join(d, "cgroup.procs") for d in cgroup_dirs]

    def child() -> None:
        for path in procs_files:
            with open(path, "w") as fh:
                fh.write(str(os.getpid()))
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_time_s, limits.cpu_time_s + 5))
        size = limits.max_file_mb << 20
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if mem_fallback:
            mem = limits.memory_mb << 20
            resource.setrlimit(resource.RLIMIT_DATA, (mem, mem))
        if nproc is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        if limits.cores:
            os.sched_setaffinity(0, limits.cores)

    return child


def _procs(pids: list[int] | set[int]) -> list[psutil.Process]:
    out = []
    for pid in pids:
        try:
            out.append(psutil.Process(pid))
        except psutil.Error:
            pass
    return out


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def marked_pids(key: str, value: str, among: set[int] | None = None) -> set[int]:
    """Processes whose environment has key=value (those we may read: ours, or any as root)."""
    found = set()
    candidates = _procs(among) if among is not None else psutil.process_iter()
    for proc in candidates:
        try:
            if proc.pid != os.getpid() and proc.environ().get(key) == value:
                found.add(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


def kill_pids(list_pids: Callable[[], set[int]]) -> None:
    """SIGKILL every pid `list_pids()` gives (a cgroup's members), rescanning until it gives none."""
    for _ in range(50):
        pids = list_pids() - {os.getpid()}
        if not pids:
            return
        for pid in pids:
            _kill(pid)
        psutil.wait_procs(_procs(pids), timeout=0.05)


def kill_tree(pgid: int | None, key: str, value: str, among: set[int] | None = None) -> None:
    """SIGKILL a process group and every process carrying the marker, until none is left."""
    if pgid:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for _ in range(20):  # a process may fork between the scan and the kill: rescan until quiet
        pids = marked_pids(key, value, among)
        if not pids:
            return
        for pid in pids:
            _kill(pid)
        psutil.wait_procs(_procs(pids), timeout=0.05)
