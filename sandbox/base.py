"""The sandbox interface: every rollout runs in one, and the caller never knows which backend it has.

    async with make_sandbox(config.sandbox, run_id=..., rollout_id=...) as sb:   # start() ... stop()
        await sb.write_file("task/input.txt", b"...")
        result = await sb.exec("python3 solve.py", timeout=30)
        data = await sb.read_file("task/output.txt")

Paths given to `exec(cwd=...)`, `write_file` and `read_file` are relative to the sandbox's working
directory (`sb.workdir`) unless absolute. `exec` never raises for a command that fails or times out:
that is data (`ExecResult`); it raises `SandboxError` only when the sandbox itself is broken.

`max_output` caps the bytes kept of stdout and of stderr each (default: the config's
`sandbox.max_output_bytes`); the rest is read and dropped, so a process that prints 100 MB neither
blocks nor fills memory, and `ExecResult.truncated` says it happened. `read_file(max_bytes=n)` returns
at most the first n bytes. A relative path that climbs out of the working directory (`..`) is
refused with `SandboxError`; an absolute path must lie inside the sandbox (local: its folder, which
holds `workdir` and `home`; containers: anywhere in the container). A missing file raises
`SandboxFileNotFound`.

Backends label what they create with `LABELS` so `forge gc` can find what a crashed run left.

What differs between backends is declared on the class, never probed by the caller (SWE-ReX's
runtime/deployment split): `agent_proxy_url(host_url)` is the URL a harness inside uses for the proxy,
`supports_gui` / `attach_gui(spec)` run execs in a display, `runs_host_programs` says harnesses run
from this machine's installs (bound in with `with_host_folders`), and `check_isolation(config)` says
what keeps rollouts in. `SandboxBase` holds the defaults; a new backend registered in
`openforge.sandbox.factory.BACKENDS` needs no edit in the runner.
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

from openforge.errors import SandboxError

if TYPE_CHECKING:
    from openforge.sandbox.gui import GuiSpec

log = logging.getLogger(__name__)

LABEL_RUN = "openforge.run"
LABEL_ROLLOUT = "openforge.rollout"
LABEL_MANAGED = "openforge.managed"
# The data dir whose store knows the run: `forge gc` of one FORGE_HOME never judges another's runs.
LABEL_HOME = "openforge.home"


# A POSIX sh script (busybox too) that kills every process but this shell whose environ holds the
# marker $1: what an exec left in the background, setsid'd or double-forked included. Container
# backends run it as each exec ends and at its deadline. One pass is not enough: a child caught inside
# execve reads an empty environ (the new image's is not set up yet), and a marked process may fork
# while it is being killed; so another pass follows, 20 ms later, while a pass kills something or
# reads an empty environ (5 passes at most: an `env -i` process reads empty too, and kill_all ends it).
KILL_MARKED_SH = ('nl="\n"; for pass in 1 2 3 4 5; do again=; for p in /proc/[0-9]*; do '
                  '[ "${p#/proc/}" = "$$" ] && continue; '
                  'e=$( { tr "\\0" "\\n" < $p/environ; } 2>/dev/null) || continue; '
                  'case "$nl$e$nl" in *"$nl$1$nl"*) kill -9 ${p#/proc/} 2>/dev/null && again=1;; '
                  '"$nl$nl") again=1;; esac; done; [ -z "$again" ] && break; sleep 0.02; done; true')


# A POSIX sh script that ends every process the container's or pod's user can signal but this shell:
# `kill -9 -1` (one atomic pass in the kernel: a fork racing it fails, so a chain of processes that
# each fork the next and exit, which a /proc scan never catches, ends too), then waits until the
# killed are gone (zombies count as gone). It spares PID 1 by the kernel's rule and, on docker,
# docker-init and the keeper by their uid (0, with no capability the sandbox's user has). What may
# appear afterwards is only a keeper's fresh `sleep`, a child of PID 1 (a pod's keeper loop). Exit 1,
# naming the survivors, when something is still alive after 5 s.
KILL_ALL_SH = r"""
alive() { read -r s < /proc/$1/stat 2>/dev/null || return 1; s=${s##*) }; [ "${s%% *}" != Z ]; }
keeper() { read -r s < /proc/$1/stat 2>/dev/null || return 1; s=${s##*) }; s=${s#* };
  [ "${s%% *}" = 1 ] && [ "$(cat /proc/$1/comm 2>/dev/null)" = sleep ]; }
kill -9 -1 2>/dev/null
i=0
while [ $i -lt 100 ]; do left=
  for p in /proc/[0-9]*; do p=${p#/proc/}
    [ "$p" = 1 ] || [ "$p" = $$ ] || ! alive $p || keeper $p || left="$left $p"
  done
  [ -z "$left" ] && exit 0
  i=$((i + 1)); sleep 0.05
done
echo "processes survive kill_all:$left" >&2
exit 1
"""


def sandbox_labels(run_id: str, rollout_id: str) -> dict[str, str]:
    """The labels every backend puts on what it creates (containers, pods, sandbox dirs)."""
    return {LABEL_RUN: run_id, LABEL_ROLLOUT: rollout_id, LABEL_MANAGED: "1"}


class SandboxFileNotFound(SandboxError):
    """`read_file` of a path that does not exist in the sandbox."""


class SandboxPathRefused(SandboxError):
    """A path the sandbox's contents made unusable for the host: it leads out of the sandbox (a planted
    link), or is not a regular file (a FIFO, a socket, a device). The agent's doing, never an infra
    failure: the runner grades such a file as wrong."""


class IsolationUnavailable(SandboxError):
    """The configured backend cannot isolate rollouts on this machine; the message says the fix."""


@dataclass(frozen=True)
class IsolationReport:
    """What keeps a run's rollouts in: `name` is recorded as `run.isolation`."""

    name: str  # bwrap-userns | docker | kubernetes | none
    detail: str  # one line for `forge doctor` and logs


class TransientSandboxError(SandboxError):
    """A start failure worth retrying (engine busy, quota momentarily full); others fail at once."""


@dataclass
class ExecResult:
    exit_code: int  # 128+N when killed by signal N (as a shell says it); 124 on timeout
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False  # output went past max_output and was cut
    duration_s: float = 0.0


@dataclass
class SandboxInfo:
    """What the harness needs to know about where it runs."""

    backend: str  # local | docker | kubernetes
    sandbox_id: str  # process group / container id / pod name
    workdir: str  # absolute path of the working directory inside the sandbox
    proxy_host: str = "127.0.0.1"  # how a process inside reaches the proxy's host
    home: str = ""  # $HOME of processes inside (harness config files go here); "" = unknown
    labels: dict[str, str] = field(default_factory=dict)


LOOPBACK_HOSTS = ("127.0.0.1", "localhost")
# Where a sandbox's grader folder (`grader_folder`) is seen from inside: beside the root, as Harbor's /tests is.
GRADER_DIR = "/forge-grader"
# A POSIX sh script that empties GRADER_DIR of what earlier gradings (and, where its user could write there,
# the agent) left, as the sandbox's user: it fails unless nothing is left below its top level and the top
# level is empty or not the user's to write (a container's grader folder is root's: what is left there is
# forge's own empty folders, and nothing the agent made).
EMPTY_GRADER_SH = (f'cd {GRADER_DIR} && {{ chmod -R u+rwX . ; find . -mindepth 1 -delete; }} 2>/dev/null; '
                   f'cd {GRADER_DIR} && [ -z "$(find . -mindepth 2 | head -n 1)" ] && '
                   '{ [ ! -w . ] || [ -z "$(ls -A)" ]; }')


def proxy_url_via(host_url: str, proxy_host: str) -> str:
    """`host_url` (the proxy as the host reaches it) as seen from a sandbox that reaches the host at
    `proxy_host`: a loopback URL gets that host instead (a container's 127.0.0.1 is its own)."""
    parts = urlsplit(host_url)
    if parts.hostname in LOOPBACK_HOSTS and proxy_host and proxy_host not in LOOPBACK_HOSTS:
        netloc = f"{proxy_host}:{parts.port}" if parts.port else proxy_host
        return urlunsplit(parts._replace(netloc=netloc))
    return host_url


@runtime_checkable
class Sandbox(Protocol):
    info: SandboxInfo
    # Whether `attach_gui` can run execs in an X display with a browser (GUI tasks need it).
    supports_gui: bool
    # Whether harnesses run from this machine's installs (the npm cache, this venv), bound into the
    # sandbox, rather than from the sandbox image's own: `harness_available` checks the host's then.
    runs_host_programs: bool

    async def start(self) -> None:
        """Create the sandbox. Raises SandboxError with the reason (image missing, engine down, quota)."""

    async def exec(self, command: str | list[str], *, timeout: float, env: dict[str, str] | None = None,
                   cwd: str | None = None, max_output: int | None = None, stdin: bytes | None = None,
                   ) -> ExecResult:
        """Run a command (a string goes to `sh -c`); kill it and everything it started at `timeout`."""

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None: ...

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes: ...

    async def kill_all(self) -> None:
        """Kill every process the sandbox holds (its pid namespace, cgroup or container), however it
        hid (setsid, `env -i`, double fork); the sandbox stays usable for the verifier's exec."""

    async def stop(self) -> None:
        """Kill every process and remove the sandbox. Idempotent; never raises for an already-gone sandbox."""

    def agent_proxy_url(self, host_url: str) -> str:
        """The proxy's URL as a harness inside this (started) sandbox reaches it, for a proxy the host
        reaches at `host_url`: a forwarder of the proxy's unix socket, a configured in-cluster address,
        or `host_url` itself where the sandbox shares the host's network."""

    def expose_socket(self, host_socket: str, host_url: str, port: int) -> str:
        """The URL a program inside reaches a host server at, for a server listening on the unix socket
        `host_socket` and (for a sandbox that shares the host's network) at `host_url`: the following
        execs get the socket forwarded to their own 127.0.0.1:`port` where the sandbox is isolated.
        SandboxError when this backend cannot reach such a server (a rollout's task tools)."""

    def withdraw_sockets(self) -> None:
        """Undo every `expose_socket`: the following execs (the grader's) reach none of those servers."""

    def attach_gui(self, spec: "GuiSpec | None") -> None:
        """Run the following execs in an X display with a browser on `spec`; None detaches. Raises
        SandboxError when this sandbox cannot (`supports_gui` False, or a setting it lacks)."""

    async def grader_folder(self) -> str:
        """A folder, empty now, for a grader's files (a Harbor task's tests and reward folder); called once
        the agent is gone (`kill_all`). It lies outside the working directory, HOME and TMPDIR, under no
        folder the sandbox's processes can write, and nothing they left is in it, so no file of the agent's
        lies beside or above the grader's (a conftest.py or pytest.ini that pytest would load). The execs
        that follow may write in it; the next call empties it again (a next step's agent finds no tests)."""

    async def __aenter__(self) -> "Sandbox": ...

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None: ...


class SandboxStartFailed(SandboxError):
    """Every start attempt failed: `attempts` made, `last` the last attempt's exception."""

    def __init__(self, message: str, *, attempts: int, last: BaseException) -> None:
        super().__init__(message)
        self.attempts, self.last = attempts, last


def retry_delay(attempt: int) -> float:
    """Seconds to wait after failed attempt number `attempt` (1-based): 0.2, 0.4, 0.8, ... capped at 5."""
    return min(0.2 * 2 ** (attempt - 1), 5.0)


async def start_with_retry(make: Callable[[], "Sandbox"], *, retries: int, timeout: float | None = None,
                           on_attempt: Callable[[int, BaseException | None], Awaitable[None]] | None = None,
                           ) -> "Sandbox":
    """A started sandbox: `make()` gives a fresh (or stopped) one per attempt, `start()` is retried up to
    `retries` times after a `TransientSandboxError`, an `OSError` or a start past `timeout`; any other
    `SandboxError` (an image that does not exist) fails at once, since retrying cannot help. A failed
    attempt's sandbox is stopped before the next. `on_attempt(n, error or None)` is awaited after each
    attempt (the runner records the count). Raises `SandboxStartFailed` with the last reason."""
    last: BaseException | None = None
    attempt = 0
    for attempt in range(1, retries + 2):
        sb: Sandbox | None = None
        try:
            sb = make()
            await asyncio.wait_for(sb.start(), timeout)
        except (SandboxError, OSError, TimeoutError) as exc:
            last = exc
            if sb is not None:
                await stop_shielded(sb)
            if on_attempt is not None:
                await on_attempt(attempt, exc)
            log.warning("sandbox start %d/%d failed: %s", attempt, retries + 1, exc)
            if isinstance(exc, SandboxError) and not isinstance(exc, TransientSandboxError):
                break
            if attempt <= retries:
                await asyncio.sleep(retry_delay(attempt))
            continue
        except BaseException:  # cancelled mid-start: nothing may be left running
            if sb is not None:
                await stop_shielded(sb)
            raise
        if on_attempt is not None:
            await on_attempt(attempt, None)
        return sb
    reason = f"{type(last).__name__}: {last}" if isinstance(last, TimeoutError) else str(last)
    assert last is not None
    raise SandboxStartFailed(f"sandbox failed to start after {attempt} attempt(s): {reason}", attempts=attempt,
                             last=last)


async def stop_shielded(sb: "Sandbox") -> None:
    """stop() that a cancellation cannot interrupt halfway (which would leak processes), and whose
    failure is logged, not raised: cleanup must not mask the outcome of what ran in the sandbox."""
    task = asyncio.ensure_future(sb.stop())
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])  # finish the cleanup, then let the cancellation continue
        raise
    except Exception as exc:  # noqa: BLE001 - see the docstring
        log.warning("stopping sandbox %s failed: %s", getattr(sb.info, "sandbox_id", "?"), exc)


class SandboxBase:
    """Shared context-manager behaviour: `async with` starts (through `start_with_retry`, retrying a
    transient failure up to `start_retries` times), and always stops, even on cancellation. The
    capability defaults are a headless sandbox on the host's network that carries its own programs.

    A backend's constructor is `(config, *, run_id, rollout_id, proxy_socket=None, site_socket=None)`
    (`make_sandbox` calls it so); a socket a backend cannot bind it ignores."""

    info: SandboxInfo
    start_retries: int = 0
    supports_gui: ClassVar[bool] = False
    runs_host_programs: ClassVar[bool] = False
    # What a task's storage_mb (`with_limits`) is on this backend, in the words `storage_notice` prints
    # (sandbox/limits.py): none is a quota on the total written yet, and forge says so rather than pretend.
    storage_enforced_as: ClassVar[str] = "not applied (this backend takes no task limits)"

    @classmethod
    def check_isolation(cls, config: Any) -> IsolationReport:  # pragma: no cover - implemented by backends
        """What keeps rollouts in under `config` on this machine; IsolationUnavailable (with the fix)
        when nothing would."""
        raise NotImplementedError

    @classmethod
    def preflight(cls, config: Any) -> None:
        """SandboxError, with the fix, when what this backend runs on does not answer (its engine, its
        cluster); called by its config's `preflight_checks` before a run starts."""

    @classmethod
    def plan_manifests(cls, config: Any, *, proxy_port: int, gui: bool) -> list[dict[str, Any]]:
        """What this backend creates in a cluster for every rollout, for a dry run; none by default."""
        return []

    @classmethod
    def collect_leftovers(cls, config: Any, **sweep: Any) -> tuple[list[Any], list[str]]:
        """What crashed runs left off this machine, as sandbox/gc.py's `collect_all` sweeps it; nothing by
        default (folders and containers on this machine are swept there for every backend)."""
        return [], []

    @classmethod
    def with_host_folders(cls, config: Any, folders: list[str]) -> Any:
        """`config` with host `folders` made readable inside (a harness install): only a backend that
        runs host programs binds them; one that carries its own install returns `config` as it is."""
        return config

    @classmethod
    def with_limits(cls, config: Any, limits: Any) -> Any:
        """`config` sized to a task's own needs (`TaskSpec.limits`, sandbox/limits.py: Harbor's `[environment]`
        cpus / memory_mb / storage_mb), each as this backend can honour it; SandboxError where it cannot."""
        raise SandboxError(f"this task declares its own resource limits; the {config.type} backend cannot apply them")

    @classmethod
    def with_image(cls, config: Any, image: str, workdir: str) -> Any:
        """`config` running a task's own image (`TaskSpec.image`, a Harbor environment built by `forge tasks
        import harbor`) in its working directory; SandboxError where this backend runs no such image."""
        raise SandboxError(f"this task runs in its own image {image} (built by `forge tasks import harbor`): the "
                           f"{config.type} backend cannot run it; use sandbox.type = \"docker\"")

    @classmethod
    def with_services(cls, config: Any, services: list[dict[str, Any]]) -> Any:
        """`config` starting a task's compose services beside the agent (sandbox/compose.py: a Harbor task's
        docker-compose.yaml services, reached by name); SandboxError where this backend cannot."""
        raise SandboxError(f"this task runs compose services beside the agent ({', '.join(s['name'] for s in services)}"
                           f"), each reached by its name: the {config.type} backend cannot run them; use "
                           "sandbox.type = \"docker\"")

    def agent_proxy_url(self, host_url: str) -> str:
        return proxy_url_via(host_url, self.info.proxy_host)

    def expose_socket(self, host_socket: str, host_url: str, port: int) -> str:
        raise SandboxError(f"the {self.info.backend} backend cannot reach a server on the host yet (a task's "
                           "tools and services need sandbox.type = \"local\", \"docker\" or \"kubernetes\")")

    def withdraw_sockets(self) -> None:
        pass  # nothing was exposed

    def attach_gui(self, spec: "GuiSpec | None") -> None:
        if spec is not None:
            raise SandboxError(f"the {self.info.backend} backend has no display for GUI tasks")

    async def grader_folder(self) -> str:
        raise SandboxError(f"the {self.info.backend} backend has no folder out of the agent's reach for a grader")

    async def start(self) -> None:  # pragma: no cover - implemented by backends
        raise NotImplementedError

    async def stop(self) -> None:  # pragma: no cover - implemented by backends
        raise NotImplementedError

    async def __aenter__(self):  # type: ignore[no-untyped-def]
        try:
            await start_with_retry(lambda: self, retries=self.start_retries)  # type: ignore[arg-type,return-value]
        except SandboxStartFailed as exc:
            raise exc.last from None  # the backend's own error, as a caller of start() would see it
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:  # type: ignore[no-untyped-def]
        await stop_shielded(self)  # type: ignore[arg-type]


def container_path(workdir: str, path: str) -> str:
    """A path inside a container or pod sandbox: relative ones must stay in `workdir`; an absolute one
    may be anywhere (the container is the sandbox: harness config under $HOME lives outside the workdir)."""
    if posixpath.isabs(path):
        return posixpath.normpath(path)
    root = posixpath.normpath(workdir)
    full = posixpath.normpath(posixpath.join(root, path))
    if full != root and not full.startswith(root + "/"):
        raise SandboxError(f"path {path!r} leaves the sandbox's working directory {root}")
    return full
