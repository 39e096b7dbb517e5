"""The sandbox interface: every rollout runs in one, and the caller never knows which backend it has.

    async with make_sandbox(config.sandbox, run_id=..., rollout_id=...) as sb:   # start() ... stop()
        await sb.write_file("task/input.txt", b"...")
        result = await sb.exec("python3 solve.py", timeout=30)
        data = await sb.read_file("task/output.txt")

Paths given to `exec(cwd=...)`, `write_file` and `read_file` are relative to the sandbox's working
directory (`sb.workdir`) unless absolute. `exec` never raises for a command that fails or times out:
that is data (`ExecResult`); it raises `SandboxError` only when the sandbox itself is broken.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol, runtime_checkable


@dataclass
class ExecResult:
    exit_code: int  # -signal number when killed by a signal; 124 on timeout
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
    labels: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class Sandbox(Protocol):
    info: SandboxInfo

    async def start(self) -> None:
        """Create the sandbox. Raises SandboxError with the reason (image missing, engine down, quota)."""

    async def exec(self, command: str | list[str], *, timeout: float, env: dict[str, str] | None = None,
                   cwd: str | None = None, max_output: int | None = None, stdin: bytes | None = None,
                   ) -> ExecResult:
        """Run a command (a string goes to `sh -c`); kill it and everything it started at `timeout`."""

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None: ...

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes: ...

    async def stop(self) -> None:
        """Kill every process and remove the sandbox. Idempotent; never raises for an already-gone sandbox."""

    async def __aenter__(self) -> "Sandbox": ...

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None: ...


class SandboxBase:
    """Shared context-manager behaviour: `async with` starts, and always stops, even on cancellation."""

    info: SandboxInfo

    async def start(self) -> None:  # pragma: no cover - implemented by backends
        raise NotImplementedError

    async def stop(self) -> None:  # pragma: no cover - implemented by backends
        raise NotImplementedError

    async def __aenter__(self):  # type: ignore[no-untyped-def]
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:  # type: ignore[no-untyped-def]
        await self.stop()
