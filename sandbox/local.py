"""The local backend: a folder and a process tree on this machine, isolated with bubblewrap.

Layout of one sandbox, `$FORGE_HOME/sandboxes/<rollout id>/`:

    sandbox.json   labels + owner pid (outside what the sandbox sees, so the harness cannot rewrite it)
    work/          the working directory (`info.workdir`)
    home/  tmp/    HOME and TMPDIR of every process
    etc/           the sandbox's own passwd and group
    grader/        a grader's files (`grader_folder`: a Harbor task's tests), made once the agent is gone

Under bubblewrap a process sees work/, home/ and tmp/ at /sandbox/work, /sandbox/home and
/sandbox/tmp (and grader/, once made, at /forge-grader: under no folder the agent could write), the
same paths in every rollout (`info.workdir` and `info.home` are those): a harness writes its paths into the prompt (Claude Code names its HOME and working directory in the system
prompt), so per-rollout paths would make every rollout's prompt differ a few hundred tokens in, and
neither the engine's prefix cache nor the trainer's shared-prefix step could share the rest.

Under bubblewrap (docs/security.md) each exec is an unprivileged user namespace, as the containers' user
(`forge`, uid/gid 1000, never root: programs that refuse root run) with every capability dropped, its own
pid, ipc, uts, net and cgroup namespaces, a private /tmp, and read-only binds of only the system dirs, a
few /etc files, this Python, node and the npm cache (`runtime_mounts`); FORGE_HOME and the built-in task
set stay covered even when a bound folder holds them. Only work/, home/ and
tmp/ are writable. No network: the proxy's unix socket is bound in and `forwarder.py` serves it on the
sandbox's own 127.0.0.1 (`proxy_url`). When the command exits, its pid namespace ends and everything
it started with it; `kill_all()` also kills the sandbox's cgroup and marked processes.

Files the host reads or writes in the sandbox (`read_file`, `write_file`) must be regular files inside
it: a link out of it or a FIFO/socket raises `SandboxPathRefused`, and the I/O runs off the event loop.

With `isolation = "none"` (an explicit choice) the command is a plain subprocess in its own session
(cwd and env confined by convention only), as forge's own user (changing it would take privileges).
Either way it runs with the limits of `openforge.sandbox.procs` and a
minimal environment: nothing of the caller's environment (API keys!) leaks in unless passed as `env`.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from openforge.config import LocalSandboxConfig
from openforge.errors import SandboxError
from openforge.paths import forge_home
from openforge.sandbox.base import (GRADER_DIR, ExecResult, IsolationReport, IsolationUnavailable, SandboxBase,
                          SandboxFileNotFound, SandboxInfo, SandboxPathRefused, sandbox_labels)
from openforge.sandbox.gui import SITE_PORT, SITE_URL, GuiSpec
from openforge.sandbox.container_images import SANDBOX_UID, SANDBOX_USER, user_entries
from openforge.sandbox.limits import TaskLimits, affinity_cores
from openforge.sandbox.procs import Cgroup, Limits, cgroup_name, kill_pids, kill_tree, limit_argv, nproc_budget, preexec

SANDBOX_ENV = "OPENFORGE_SANDBOX"
EXEC_ENV = "OPENFORGE_EXEC"
META_FILE = "sandbox.json"
_CHUNK = 64 * 1024
_GRACE_S = 1.0  # after the tree is killed, how long to wait for the pipes to reach EOF


INNER_ROOT = "/sandbox"  # where work/, home/ and tmp/ appear under bubblewrap, in every rollout


def sandboxes_root(home: Path | None = None) -> Path:
    return (home or forge_home()) / "sandboxes"


# What a sandbox sees of the host, read-only: the system, never /root, /home, FORGE_HOME or the store.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
# Of /etc only what programs need to load and run; /etc/shadow, keys and service configs stay out.
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "ssl", "ca-certificates", "localtime",
             "nsswitch.conf", "hosts", "host.conf", "gai.conf", "mime.types", "os-release", "debian_version",
             "protocols", "services", "timezone")
ISOLATION_FIX = ("local sandboxes cannot be isolated here (bubblewrap is missing or cannot create namespaces): "
                 "install it (apt-get install bubblewrap) or use sandbox.type = \"docker\"; to run rollouts "
                 "unisolated anyway, set sandbox.isolation = \"none\"")
PROXY_SOCKET = "/run/forge/proxy.sock"  # where the proxy's unix socket appears inside the sandbox
PROXY_PORT = 8700  # the forwarder's port on the sandbox's own loopback (each exec has its own network)
FORWARDER = Path(__file__).with_name("forwarder.py")
FORWARDER_INSIDE = "/run/forge/forwarder.py"
GUI_MODULE = Path(__file__).with_name("gui.py")
GUI_INSIDE = "/run/forge/gui.py"
SITE_SOCKET = "/run/forge/site.sock"  # where a GUI task's site socket appears inside the sandbox
# /etc/X11: the X Toolkit applications' app-defaults (/etc/X11/app-defaults): without its resources xedit
# sizes its menus to nothing and exits (a desktop task's applications, rollouts/tasks/desktop/task.py).
# /etc/libreoffice: LibreOffice's configuration schema (Debian links /usr/lib/libreoffice/share/registry to
# /etc/libreoffice/registry): without it soffice dies at start ("Unspecified Application Error").
GUI_ETC = ("/etc/fonts", "/etc/chromium", "/etc/chromium.d", "/etc/X11", "/etc/libreoffice")
# The sandbox's user is the containers' `forge` (uid/gid 1000), never root: programs that refuse root
# (VLC's "not supposed to be run as root") run. An unprivileged user namespace maps one id: 1000 inside
# is forge's own uid outside, so whatever forge writes into the sandbox is the user's, and no host id
# beyond forge's own gains anything (every other owner reads as nobody inside).
ISOLATION_FLAGS = ("--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--cap-drop", "ALL",
                   "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--unshare-cgroup-try",
                   "--new-session", "--die-with-parent")


@functools.lru_cache(maxsize=1)
def bwrap_usable() -> str | None:
    """Path of a bwrap that can create every namespace we ask for here, else None (probed once)."""
    path = shutil.which("bwrap")
    if not path:
        return None
    try:
        ok = subprocess.run([path, *ISOLATION_FLAGS, *_system_binds(), "--dev", "/dev", "--proc", "/proc", "true"],
                            capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return path if ok else None


def _bind(path: str | Path, dest: str | Path | None = None) -> list[str]:
    """--ro-bind for a real path, --symlink for a link (merged /usr: /bin -> usr/bin); [] if absent."""
    path, dest = str(path), str(dest or path)
    if os.path.islink(path):
        return ["--symlink", os.readlink(path), dest]
    return ["--ro-bind", path, dest] if os.path.exists(path) else []


def _system_binds() -> list[str]:
    out: list[str] = []
    for d in SYSTEM_DIRS:
        out += _bind(d)
    for name in ETC_FILES:
        out += _bind(f"/etc/{name}")
    return out


def hidden_paths() -> list[str]:
    """What no sandbox may see even when a bound folder holds it: FORGE_HOME (the store, every
    sandbox's files) and the task sets forge ships (expected answers, verifiers: a wheel install puts
    them in the venv, which every sandbox sees)."""
    builtin = Path(__file__).resolve().parent.parent / "rollouts" / "tasks" / "builtin"
    web = builtin.parent / "web"  # the GUI sites' data and their task set
    arith = builtin.parent / "arith"  # the generated family: its held-out split's answers above all
    return sorted({os.path.realpath(p) for p in (forge_home(), builtin, web, arith) if os.path.isdir(p)})


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def runtime_mounts(extra: list[str]) -> list[str]:
    """bwrap arguments binding `runtime_paths(extra)` read-only, with each of `hidden_paths()` that
    one of them (or a system dir) would show covered by an empty tmpfs; a runtime path inside a hidden
    one (the npm cache under FORGE_HOME) is bound again on top of that."""
    paths = runtime_paths(extra)
    roots = [*SYSTEM_DIRS, *paths]
    hide = [h for h in hidden_paths() if any(_under(h, r) for r in roots)]
    first = [p for p in paths if not any(_under(p, h) for h in hide)]
    out: list[str] = []
    for p in first:
        out += ["--ro-bind", p, p]
    for h in hide:
        out += ["--tmpfs", h]  # made read-only by _argv once the sandbox's own folders are bound inside
    for p in paths:
        if p not in first:
            out += ["--ro-bind", p, p]
    return out


def _hidden_in(mounts: list[str]) -> list[str]:
    return [mounts[i + 1] for i, arg in enumerate(mounts) if arg == "--tmpfs" and mounts[i + 1] != "/tmp"]


def runtime_paths(extra: list[str]) -> list[str]:
    """Host folders a harness needs beyond the system: this interpreter's prefixes (the venv and the
    Python it was made from, possibly under /root), node's install, the npm harness cache, and
    `extra` (sandbox.read_only_paths). Parents are not bound, only these folders."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.dirname(
        os.path.realpath(sys.executable)))}
    node = shutil.which("node")
    if node:
        paths.add(os.path.dirname(os.path.dirname(os.path.realpath(node))))
    cache = os.environ.get("FORGE_NPM_CACHE") or str(forge_home() / "npm")
    paths.update([cache, *extra])
    # A folder inside one already bound needs no bind of its own; the system dirs are bound already.
    real = sorted({os.path.realpath(os.path.expanduser(p)) for p in paths if p and os.path.isdir(p)})
    keep = [p for p in real if not any(p.startswith(s + "/") for s in SYSTEM_DIRS)
            and not any(p.startswith(q + "/") for q in real if q != p)]
    return keep


class LocalSandbox(SandboxBase):
    supports_gui = True  # with bubblewrap: each GUI exec gets a display of its own (attach_gui)
    runs_host_programs = True  # harnesses run from this machine's npm cache and venv, bound in read-only

    @classmethod
    def check_isolation(cls, config: LocalSandboxConfig) -> IsolationReport:
        if config.isolation == "none":
            return IsolationReport("none", 'sandbox.isolation = "none": rollouts run as plain host processes')
        if config.allow_internet:  # bubblewrap gives an empty network namespace or the host's own, nothing between
            raise IsolationUnavailable(
                "sandbox.allow_internet: a local sandbox cannot open the internet without the host's own network "
                "(its loopback: the engine's and the proxy's ports); use sandbox.type = \"docker\" or \"kubernetes\"")
        path = bwrap_usable()
        if not path:
            raise IsolationUnavailable(ISOLATION_FIX)
        return IsolationReport("bwrap-userns", f"{path}: user (uid {SANDBOX_UID} {SANDBOX_USER}), pid, net, ipc, uts, "
                                               "cgroup namespaces, no capabilities")

    storage_enforced_as = ("a cap on each file's size (RLIMIT_FSIZE), not on the total written: the sandbox's "
                           "folders are host folders with no quota")

    @classmethod
    def with_limits(cls, config: LocalSandboxConfig, limits: TaskLimits) -> LocalSandboxConfig:
        update: dict[str, int] = {}
        if limits.cpus is not None:
            update["cpus"] = affinity_cores(limits.cpus)
        if limits.memory_mb is not None:
            update["memory_mb"] = limits.memory_mb
        if limits.storage_mb is not None:  # no disk quota on a folder: no file may outgrow the task's disk
            update["max_file_mb"] = limits.storage_mb
        return config.model_copy(update=update)

    @classmethod
    def with_host_folders(cls, config: LocalSandboxConfig, folders: list[str]) -> LocalSandboxConfig:
        # An isolated local sandbox sees only the host folders it is given.
        return config.model_copy(update={"read_only_paths": [*config.read_only_paths, *folders]})

    def __init__(self, config: LocalSandboxConfig, *, run_id: str, rollout_id: str, root: Path | None = None,
                 proxy_socket: str | Path | None = None, site_socket: str | Path | None = None) -> None:
        # site_socket: unused here; a GUI exec binds the site socket `attach_gui(spec)` names.
        self.config = config
        self.cfg = config
        self.start_retries = config.start_retries
        self.id = rollout_id
        self.dir = (root or sandboxes_root()) / rollout_id
        self.labels = sandbox_labels(run_id, rollout_id)
        self.info = SandboxInfo(backend="local", sandbox_id=rollout_id, workdir=str(self.dir / "work"),
                                home=str(self.dir / "home"), labels=self.labels)
        ours = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self.limits = Limits(self.cfg.cpu_time_s, self.cfg.memory_mb, self.cfg.max_processes, self.cfg.max_file_mb,
                             cores=tuple(ours[:self.cfg.cpus]) if self.cfg.cpus and self.cfg.cpus < len(ours) else ())
        self.bwrap: str | None = None
        self.proxy_socket = str(proxy_socket) if proxy_socket else None
        self.cgroup: Cgroup | None = None
        self._started = self._created = False
        # While set, each exec runs inside a display (and browser) of its own: `attach_gui`.
        self.gui: GuiSpec | None = None
        # Host sockets forwarded to each exec's own 127.0.0.1:port (`expose_socket`): port -> socket.
        self.exposed: dict[int, str] = {}

    def attach_gui(self, spec: GuiSpec | None) -> None:
        """Run the following execs with an X display (Xvfb), chromium on `spec.url` and the site's
        socket forwarded to 127.0.0.1:SITE_PORT; None detaches. Each exec gets its own display, in
        its own network and pid namespaces: it ends with the exec. Needs bubblewrap: unisolated, the
        display and the site's port would be the host's."""
        if spec is not None and not self.bwrap:
            raise SandboxError("a GUI sandbox needs bubblewrap isolation (its display and site port must be "
                               "private to the sandbox): install bubblewrap, or use sandbox.type = \"docker\"")
        self.gui = spec

    @property
    def isolation(self) -> str:
        return "bwrap-userns" if self.bwrap else "none"

    @property
    def proxy_url(self) -> str | None:
        """The proxy as a harness inside reaches it; None = use the proxy's own URL (no isolation:
        the sandbox shares the host's network)."""
        return f"http://127.0.0.1:{PROXY_PORT}" if self.bwrap and self.proxy_socket else None

    def agent_proxy_url(self, host_url: str) -> str:
        return self.proxy_url or super().agent_proxy_url(host_url)

    def expose_socket(self, host_socket: str, host_url: str, port: int) -> str:
        if not self.bwrap:  # unisolated: the sandbox shares the host's network
            return host_url
        if port == PROXY_PORT or (self.gui and port == SITE_PORT):
            raise SandboxError(f"port {port} is taken inside the sandbox")
        self.exposed[port] = host_socket
        path = urlsplit(host_url).path
        return f"http://127.0.0.1:{port}{path}"

    def withdraw_sockets(self) -> None:
        self.exposed.clear()

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._started:
            return
        mode = self.cfg.isolation
        self.bwrap = bwrap_usable() if mode in ("auto", "bwrap") else None
        if mode != "none" and not self.bwrap:  # never silently unisolated
            raise IsolationUnavailable(ISOLATION_FIX)
        self._created = True  # from here on stop() has something to clean, even if start() fails
        self.info.workdir, self.info.home = self._inner("work"), self._inner("home")
        if self.dir.exists():  # a leftover of the same rollout id: never reuse its files
            await asyncio.to_thread(remove_tree, self.dir)
        try:
            for sub in ("work", "home", "tmp", "etc"):
                (self.dir / sub).mkdir(parents=True, exist_ok=True)
            # Who the sandbox's user is, without the host's account list (unisolated these are not used:
            # the commands run as forge's own user).
            passwd, group = user_entries(self._inner("home"))
            (self.dir / "etc" / "passwd").write_text(
                f"root:x:0:0:root:/root:/bin/sh\n{passwd}nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
            (self.dir / "etc" / "group").write_text(f"root:x:0:\n{group}nogroup:x:65534:\n")
            meta = {"labels": self.labels, "owner_pid": os.getpid(), "created": time.time()}
            (self.dir / META_FILE).write_text(json.dumps(meta))
        except OSError as exc:
            raise SandboxError(f"cannot create the sandbox folder {self.dir}: {exc.strerror}") from None
        self.cgroup = Cgroup(cgroup_name(self.id), self.limits)
        self._started = True

    async def stop(self) -> None:
        if not self._created:  # never started: the folder, if any, is not this object's to remove
            return
        await asyncio.to_thread(self._stop_sync)
        self._started = self._created = False

    async def kill_all(self) -> None:
        """Kill every process this sandbox holds: each in its cgroup (a process that dropped the
        environment marker with `env -i` is still in it) and each carrying the marker anywhere.
        Under bubblewrap each exec's pid namespace has already ended with the exec."""
        if self._started:
            await asyncio.to_thread(self._kill_all_sync)

    def _kill_all_sync(self) -> None:
        if self.cgroup and self.cgroup.dirs:
            kill_pids(self.cgroup.pids)
        kill_tree(None, SANDBOX_ENV, self.id)

    def _stop_sync(self) -> None:
        self._kill_all_sync()
        if self.cgroup:
            self.cgroup.remove()
        remove_tree(self.dir)

    # -- exec --------------------------------------------------------------------------------------
    def _argv(self, command: str | list[str], cwd: str) -> list[str]:
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        if not argv:
            raise SandboxError("exec needs a command")
        if not self.bwrap:
            return argv
        if not isinstance(command, str):  # bwrap says "execvp failed" with exit 1; a shell says 127
            argv = ["/bin/sh", "-c", 'exec "$@"', "sh", *argv]
        d = str(self.dir)
        # /tmp is the sandbox's own tmpfs, mounted first: what is bound after it (a FORGE_HOME or an npm
        # cache under /tmp) lands on top of it instead of being hidden by it.
        mounts = ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", *_system_binds(),
                  "--ro-bind", str(self.dir / "etc" / "passwd"), "/etc/passwd",
                  "--ro-bind", str(self.dir / "etc" / "group"), "/etc/group"]
        mounts += runtime_mounts(self.cfg.read_only_paths)
        # Only work/, home/ and tmp/ are writable; sandbox.json beside them stays out of reach.
        for sub in ("work", "home", "tmp"):
            mounts += ["--bind", f"{d}/{sub}", self._inner(sub)]
        if os.path.isdir(f"{d}/grader"):  # made by grader_folder once the agent is gone (a fresh bwrap root holds it)
            mounts += ["--bind", f"{d}/grader", self._inner("grader")]
        mounts += [arg for h in _hidden_in(mounts) for arg in ("--remount-ro", h)]
        if self.gui is not None:  # the display, the browser and the site's door (sandbox/gui.py)
            argv = [sys.executable, "-I", GUI_INSIDE, *self.gui.launcher_args(), *argv]
            mounts += ["--ro-bind", str(GUI_MODULE), GUI_INSIDE]
            for etc in GUI_ETC:  # fonts, chromium's own config (/usr/bin/chromium sources it), X resources
                mounts += ["--ro-bind-try", etc, etc]
            if self.gui.site_socket:
                mounts += ["--bind", self.gui.site_socket, SITE_SOCKET]
                argv = [sys.executable, "-I", FORWARDER_INSIDE, "--socket", SITE_SOCKET, "--port", str(SITE_PORT),
                        "--", *argv]
        if self.proxy_socket:
            mounts += ["--bind", self.proxy_socket, PROXY_SOCKET]
        for port, host_socket in self.exposed.items():
            inside = f"/run/forge/exposed-{port}.sock"
            mounts += ["--bind", host_socket, inside]
            argv = [sys.executable, "-I", FORWARDER_INSIDE, "--socket", inside, "--port", str(port), "--", *argv]
        if self.proxy_socket or (self.gui and self.gui.site_socket) or self.exposed:
            mounts += ["--ro-bind", str(FORWARDER), FORWARDER_INSIDE]
        if self.proxy_socket:
            argv = [sys.executable, "-I", FORWARDER_INSIDE, "--socket", PROXY_SOCKET,
                    "--port", str(PROXY_PORT), "--", *argv]
        return [self.bwrap, *ISOLATION_FLAGS, *mounts, "--chdir", cwd, "--", *argv]

    def _env(self, env: dict[str, str] | None, exec_id: str) -> dict[str, str]:
        base = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "LANG": "C.UTF-8",
                "HOME": self._inner("home"), "TMPDIR": self._inner("tmp"), "TERM": "dumb"}
        if self.gui is not None:
            base.update(FORGE_GUI=GUI_INSIDE, FORGE_PYTHON=sys.executable,
                        **({"FORGE_SITE_URL": SITE_URL} if self.gui.site_socket else {}))
        # The markers go last so a caller's env cannot remove them (they are how stop() finds strays).
        return {**base, **(env or {}), SANDBOX_ENV: self.id, EXEC_ENV: exec_id}

    async def exec(self, command: str | list[str], *, timeout: float, env: dict[str, str] | None = None,
                   cwd: str | None = None, max_output: int | None = None, stdin: bytes | None = None,
                   ) -> ExecResult:
        if not self._started:
            raise SandboxError("the sandbox is not started (use `async with` or call start())")
        workdir = str(self._resolve(cwd)) if cwd else str(self.dir / "work")
        exec_id = secrets.token_hex(8)
        cap = max_output or self.config.max_output_bytes
        cg = self.cgroup
        dirs = [str(d) for d in cg.dirs] if cg else []
        nproc = None if cg and cg.limits_pids else nproc_budget(self.limits.max_processes)
        mem_fallback = not (cg and cg.limits_memory)
        prefix = limit_argv(self.limits, dirs, nproc=nproc, mem_fallback=mem_fallback)
        child = None if prefix else preexec(self.limits, dirs, nproc=nproc, mem_fallback=mem_fallback)
        start = time.monotonic()
        # Our own pipes, not asyncio's: asyncio's Process.wait() returns only once every pipe is
        # closed, so a background child holding stdout would turn a finished command into a timeout.
        # stdin comes from a file for the same reason (and a command that never reads it cannot block us).
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        stdin_file = self._stdin_file(exec_id, stdin)
        try:
            proc = await asyncio.create_subprocess_exec(
                *(prefix or []), *self._argv(command, self._inside(workdir)), cwd=workdir, env=self._env(env, exec_id),
                stdin=stdin_file if stdin_file is not None else asyncio.subprocess.DEVNULL,
                stdout=out_w, stderr=err_w, start_new_session=True, preexec_fn=child)
        except (FileNotFoundError, PermissionError) as exc:  # what a shell reports as 127 / 126
            os.close(out_r), os.close(err_r)
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            return ExecResult(exit_code=code, stdout="", stderr=f"{exc.filename}: {exc.strerror}\n",
                              duration_s=time.monotonic() - start)
        except OSError as exc:
            os.close(out_r), os.close(err_r)
            raise SandboxError(f"cannot start {command!r} in sandbox {self.id}: {exc}") from None
        finally:
            os.close(out_w), os.close(err_w)
            if stdin_file is not None:
                stdin_file.close()
                os.unlink(stdin_file.name)
        return await self._collect(proc, exec_id, cap, timeout, (out_r, err_r), start)

    def _stdin_file(self, exec_id: str, data: bytes | None):  # type: ignore[no-untyped-def]
        if data is None:
            return None
        path = self.dir / "tmp" / f".stdin-{exec_id}"  # in the sandbox's tmp/: never follow what is there
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        return open(path, "rb")

    async def _collect(self, proc: asyncio.subprocess.Process, exec_id: str, cap: int, timeout: float,
                       fds: tuple[int, int], start: float) -> ExecResult:
        outs = (_Capped(cap), _Capped(cap))
        readers = [asyncio.ensure_future(o.drain_fd(fd)) for o, fd in zip(outs, fds)]
        timed_out = False
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except asyncio.TimeoutError:
            timed_out = True
        finally:
            # Whatever the command left running ends with it (under bwrap its pid namespace already
            # did that): on timeout, on our caller's cancellation, and after a normal exit.
            if timed_out or proc.returncode is None or not self.bwrap:
                await asyncio.to_thread(self._kill_exec, proc.pid, exec_id)
            _, pending = await asyncio.wait(readers, timeout=_GRACE_S)
            for task in pending:
                task.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
            await proc.wait()
        # A signal death reads as 128+N, as a shell (and bwrap, and docker) reports it.
        code = 124 if timed_out else (proc.returncode if proc.returncode >= 0 else 128 - proc.returncode)
        return ExecResult(exit_code=code, stdout=outs[0].text(), stderr=outs[1].text(), timed_out=timed_out,
                          truncated=outs[0].truncated or outs[1].truncated, duration_s=time.monotonic() - start)

    def _kill_exec(self, pgid: int, exec_id: str) -> None:
        among = self.cgroup.pids() if self.cgroup and self.cgroup.dirs else None
        kill_tree(pgid, EXEC_ENV, exec_id, among)

    async def grader_folder(self) -> str:
        await asyncio.to_thread(self._fresh_grader_folder)
        return self._inner("grader")

    def _fresh_grader_folder(self) -> None:
        # What an earlier grading (or a later step's agent) left goes aside by a rename, out of every bind:
        # no time however many files are in it, and the sandbox's removal takes it.
        folder = self.dir / "grader"
        try:
            if folder.exists() or folder.is_symlink():
                folder.rename(self.dir / f"grader-left-{secrets.token_hex(4)}")
            folder.mkdir()
        except OSError as exc:
            raise SandboxError(f"cannot make the grader's folder in sandbox {self.id}: {exc.strerror}") from None

    # -- files -------------------------------------------------------------------------------------
    def _inner(self, sub: str) -> str:
        """Where the sandbox's `sub` folder (work, home, tmp, grader) is seen from inside it."""
        if not self.bwrap:
            return str(self.dir / sub)
        return GRADER_DIR if sub == "grader" else f"{INNER_ROOT}/{sub}"

    def _inside(self, host_path: str) -> str:
        """A host path under the sandbox folder as the sandbox sees it."""
        rel = os.path.relpath(os.path.realpath(host_path), os.path.realpath(self.dir))
        sub, _, rest = rel.partition(os.sep)
        return os.path.join(self._inner(sub), rest) if rest else self._inner(sub)

    def _host(self, path: str) -> str:
        """An absolute path as the sandbox sees it (/sandbox/work/x) on the host; others unchanged."""
        if self.bwrap and (path == INNER_ROOT or path.startswith(INNER_ROOT + "/")):
            return str(self.dir) + path[len(INNER_ROOT):]
        if self.bwrap and (path == GRADER_DIR or path.startswith(GRADER_DIR + "/")):
            return str(self.dir / "grader") + path[len(GRADER_DIR):]
        return path

    def _resolve(self, path: str) -> Path:
        """The real path for `path`: relative ones must stay in the workdir, absolute ones (as the
        sandbox sees them, or on the host) in the sandbox folder. realpath() follows symlinks, so a
        link the harness plants cannot carry a write outside."""
        path = self._host(path)
        work = str(self.dir / "work")
        root = os.path.realpath(work if not os.path.isabs(path) else self.dir)
        full = os.path.realpath(os.path.join(work, path))
        if full != root and not full.startswith(root + os.sep):
            raise SandboxPathRefused(f"path {path!r} leaves the sandbox ({root})")
        return Path(full)

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        full = self._resolve(path)
        await asyncio.to_thread(self._write_sync, path, full, data, mode)

    def _write_sync(self, path: str, full: Path, data: bytes, mode: int) -> None:
        try:
            full.parent.mkdir(parents=True, exist_ok=True)
            # O_NONBLOCK: a FIFO the agent left here would block a plain open for a reader forever.
            fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, mode)
        except OSError as exc:
            if exc.errno in (errno.ENXIO, errno.ELOOP, errno.EISDIR):
                raise SandboxPathRefused(f"cannot write {path} in sandbox {self.id}: not a regular file") from None
            raise SandboxError(f"cannot write {path} in sandbox {self.id}: {exc.strerror}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise SandboxPathRefused(f"cannot write {path} in sandbox {self.id}: not a regular file")
            os.set_blocking(fd, True)
            os.ftruncate(fd, 0)
            with os.fdopen(fd, "wb", closefd=False) as fh:
                fh.write(data)
            os.fchmod(fd, mode)
        except OSError as exc:
            raise SandboxError(f"cannot write {path} in sandbox {self.id}: {exc.strerror}") from None
        finally:
            os.close(fd)

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        full = self._resolve(path)
        return await asyncio.to_thread(self._read_sync, path, full, max_bytes)

    def _read_sync(self, path: str, full: Path, max_bytes: int | None) -> bytes:
        """Regular files only: a FIFO would block the open (and, on the event loop, the proxy with it),
        a socket fails it, a device could be endless."""
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise SandboxFileNotFound(f"{path}: no such file in the sandbox") from None
        except OSError as exc:
            if exc.errno in (errno.ENXIO, errno.ELOOP):
                raise SandboxPathRefused(f"cannot read {path} in sandbox {self.id}: not a regular file") from None
            raise SandboxError(f"cannot read {path} in sandbox {self.id}: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise SandboxPathRefused(f"cannot read {path} in sandbox {self.id}: is a directory")
            if not stat.S_ISREG(st.st_mode):
                raise SandboxPathRefused(f"cannot read {path} in sandbox {self.id}: not a regular file")
            os.set_blocking(fd, True)
            with os.fdopen(fd, "rb", closefd=False) as fh:
                return fh.read(-1 if max_bytes is None else max_bytes)
        except OSError as exc:
            raise SandboxError(f"cannot read {path} in sandbox {self.id}: {exc.strerror}") from None
        finally:
            os.close(fd)


class _Capped:
    """Keeps the first `cap` bytes of a stream and reads (and drops) the rest."""

    def __init__(self, cap: int) -> None:
        self.cap, self.buf, self.truncated = cap, bytearray(), False

    async def drain_fd(self, fd: int) -> None:
        """Read the pipe `fd` to EOF (and close it), keeping the head."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=_CHUNK)
        pipe = os.fdopen(fd, "rb", buffering=0)
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
        try:
            while chunk := await reader.read(_CHUNK):
                room = self.cap - len(self.buf)
                if len(chunk) > room:
                    self.truncated = True
                if room > 0:
                    self.buf.extend(chunk[:room])
        finally:
            transport.close()

    def text(self) -> str:
        return bytes(self.buf).decode("utf-8", errors="replace")


def remove_tree(path: Path) -> None:
    """rm -rf that also removes what a sandboxed process made read-only."""

    def onexc(func, p, _exc):  # type: ignore[no-untyped-def]
        try:
            os.chmod(os.path.dirname(p), stat.S_IRWXU)
            if not os.path.islink(p):  # chmod follows links: one the agent planted points at a host file
                os.chmod(p, stat.S_IRWXU)
            func(p)
        except OSError:
            pass

    if path.exists():
        shutil.rmtree(path, onerror=onexc)  # onerror, not onexc: Python 3.11 has only the old name


def describe_isolation() -> tuple[str, str]:
    """(verdict, detail) for `forge doctor`: what a local sandbox gets on this machine, probed the
    same way the backend decides (bwrap_usable, a cgroup it can create)."""
    cg = Cgroup(f"doctor-{os.getpid()}", Limits(1, 64, 8, 1))
    limits = ("cgroup limits on memory and process count" if cg.limits_pids and cg.limits_memory
              else "rlimits only (no writable cgroup: process count is per-user, memory per-process)")
    cg.remove()
    if bwrap_usable():
        return "ok", (f"{shutil.which('bwrap')}: local sandboxes are isolated (user namespace as uid {SANDBOX_UID} "
                      f"{SANDBOX_USER}, no capabilities, no network); {limits}")
    why = "bwrap not found (apt-get install bubblewrap)" if not shutil.which("bwrap") else \
        "bwrap cannot create the namespaces it needs here"
    return "missing", f"{why}: local rollouts are refused unless sandbox.isolation = \"none\"; {limits}"
