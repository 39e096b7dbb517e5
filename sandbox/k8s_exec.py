"""Commands and files in a pod through the exec subresource (WebSocket, `v5`/`v4.channel.k8s.io`).

The stream carries one channel byte before each frame: 0 stdin, 1 stdout, 2 stderr, 3 the final
`metav1.Status` (`Success`, or `NonZeroExitCode` with an `ExitCode` cause), 4 resize; v5 adds a
CLOSE signal `[255, channel]`. Exec has no cwd, env or timeout of its own, so `wrap_command` builds a
small `sh` script that sets them; the timeout runs inside the pod, because closing the stream does
not kill a process in a container. Files travel as tar over the same stream, as `kubectl cp` does.
"""

from __future__ import annotations

import io
import json
import re
import secrets
import shlex
import tarfile
import threading
import time
from dataclasses import dataclass

from openforge.errors import SandboxError
from sandbox.base import TransientSandboxError

CLIENT_GRACE_S = 10.0  # how long past its timeout the client waits for the in-pod `timeout` to report
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FRAME = 1 << 16


def api_error(action: str, exc: BaseException) -> SandboxError:
    """One line from an ApiException (its Status message) or a transport error. Throttling, server
    errors, a full quota and an unreachable server are transient (the start is retried); refusals
    (RBAC, validation, a missing namespace) are not."""
    status = getattr(exc, "status", None)
    body = getattr(exc, "body", None)
    message = ""
    if body:
        try:
            message = json.loads(body).get("message", "")
        except (ValueError, AttributeError):
            message = str(body)[:300]
    if status:
        detail = f"HTTP {status} {getattr(exc, 'reason', '') or ''}".strip()
        transient = status in (429, 500, 502, 503, 504) or (status == 403 and "exceeded quota" in message)
        kind = TransientSandboxError if transient else SandboxError
        return kind(f"{action}: {detail}" + (f": {message}" if message else ""))
    return TransientSandboxError(f"{action}: {getattr(exc, 'reason', None) or exc}")


def is_not_found(exc: BaseException) -> bool:
    return getattr(exc, "status", None) == 404


@dataclass
class RawExec:
    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool
    truncated: bool
    duration_s: float


# Kills every process but this shell whose environ holds the marker $1 (POSIX sh + tr + grep, so
# busybox images work too): what an exec left in the background, or that left its process group.
_KILL_MARKED = ('for p in /proc/[0-9]*; do [ "${p#/proc/}" = "$$" ] && continue; tr "\\0" "\\n" < $p/environ '
                '2>/dev/null | grep -qx "$1" && kill -9 ${p#/proc/} 2>/dev/null; done; true')


def wrap_command(command: str | list[str], *, cwd: str, env: dict[str, str] | None, timeout: float,
                 stdin_len: int | None) -> list[str]:
    """The argv sent to the exec subresource: `sh -c` that cds, sets env, runs the command under
    `timeout`, then kills what it left behind, and exits with the command's status.

    Stdin is read through `head -c N`: the v4 channel protocol cannot close stdin, so the command
    would never see EOF; with a known length it does on both v4 and v5.
    `timeout` (not --foreground) puts the command in its own process group and signals the group at
    the deadline; -k escalates to KILL for what ignores TERM. Processes that outlive the command (in
    the background, or setsid) carry the exec's marker and are killed before the exec returns, as on
    the local and docker backends; otherwise they would hold the output stream open.
    """
    argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
    if not argv:
        raise SandboxError("exec needs a command")
    marker = f"OPENFORGE_EXEC={secrets.token_hex(8)}"
    assignments = [marker]
    for key, value in (env or {}).items():
        if not _ENV_NAME.match(key):
            raise SandboxError(f"invalid environment variable name for exec: {key!r}")
        assignments.append(f"{key}={value}")
    inner = " ".join(["timeout", "-k", "2", f"{max(timeout, 0.001):.3f}", "env",
                      *(shlex.quote(a) for a in assignments), *(shlex.quote(a) for a in argv)])
    run = f"head -c {stdin_len} | {inner}" if stdin_len is not None else f"{inner} </dev/null"
    reap = f"set -- {shlex.quote(marker)}; {_KILL_MARKED}"
    return ["sh", "-c", f"cd {shlex.quote(cwd)} || exit 1\n{run}\nrc=$?\n{reap}\nexit $rc"]


def exit_code_from_status(raw: bytes | str) -> int:
    """The exit code from the error channel's metav1.Status; SandboxError for a failure that is not
    the command's own exit (container gone, runtime error)."""
    try:
        status = json.loads(raw or "{}")
    except ValueError:
        raise SandboxError(f"exec: unreadable status from the API server: {raw[:200]!r}") from None
    if status.get("status") == "Success":
        return 0
    if status.get("reason") == "NonZeroExitCode":
        for cause in (status.get("details") or {}).get("causes") or []:
            if cause.get("reason") == "ExitCode":
                return int(cause.get("message", "1"))
    raise SandboxError(f"exec failed: {status.get('message') or status.get('reason') or 'no exit status'}")


class _Capture:
    """Keeps the first `limit` bytes of a stream and counts what it drops."""

    def __init__(self, limit: int | None) -> None:
        self.limit, self.buf, self.dropped = limit, bytearray(), 0

    def add(self, data: bytes) -> None:
        if not data:
            return
        room = len(data) if self.limit is None else max(0, self.limit - len(self.buf))
        self.buf += data[:room]
        self.dropped += len(data) - min(room, len(data))


def run_exec_stream(core, *, pod: str, namespace: str, container: str, argv: list[str], timeout: float,  # type: ignore[no-untyped-def]
                    stdin: bytes | None, limit: int | None, stopped: threading.Event) -> RawExec:
    """One exec, blocking (run it in a thread). `core` is a CoreV1Api on a client of its own:
    `stream()` swaps `api_client.call_api` for the length of the call, so two concurrent execs on one
    client would steal each other's transport."""
    from kubernetes.stream import stream

    t0 = time.monotonic()
    try:
        ws = stream(core.connect_get_namespaced_pod_exec, pod, namespace, command=argv, container=container,
                    stdin=stdin is not None, stdout=True, stderr=True, tty=False, _preload_content=False,
                    binary=True)
    except Exception as exc:
        raise api_error(f"exec in pod {pod}", exc) from None
    out, err, status = _Capture(limit), _Capture(limit), bytearray()
    hard_timeout = False
    try:
        if stdin is not None:
            for i in range(0, len(stdin), _FRAME):
                ws.write_stdin(stdin[i:i + _FRAME])
            ws.close_channel(0)  # v5 only (a no-op on v4); `head -c N` covers v4
        deadline = t0 + timeout + CLIENT_GRACE_S
        while ws.is_open():
            if time.monotonic() > deadline:
                hard_timeout = True
                break
            if stopped.is_set():
                raise SandboxError(f"pod {pod} was stopped during exec")
            ws.update(timeout=min(0.25, max(0.0, deadline - time.monotonic())))
            _drain(ws, out, err, status)
        _drain(ws, out, err, status)
    except SandboxError:
        raise
    except Exception as exc:
        raise api_error(f"exec in pod {pod}", exc) from None
    finally:
        ws.close()
    duration = time.monotonic() - t0
    if hard_timeout:
        code, timed_out = 124, True
    else:
        code = exit_code_from_status(bytes(status))
        # `timeout` exits 124; a command that ignored TERM is KILLed together with `timeout` (137).
        timed_out = code == 124 or (code == 137 and duration >= timeout)
        if timed_out:
            code = 124
    return RawExec(code, bytes(out.buf), bytes(err.buf), timed_out, bool(out.dropped or err.dropped), duration)


def _drain(ws, out: _Capture, err: _Capture, status: bytearray) -> None:  # type: ignore[no-untyped-def]
    out.add(ws.read_channel(1))
    err.add(ws.read_channel(2))
    status.extend(ws.read_channel(3) or b"")
    # The client also copies stdout+stderr into an unbounded buffer for read_all(); empty it.
    ws.read_all()


def tar_one_file(name: str, data: bytes, mode: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        member = tarfile.TarInfo(name)
        member.size, member.mode, member.mtime = len(data), mode, int(time.time())
        tar.addfile(member, io.BytesIO(data))
    return buf.getvalue()


def first_member(archive: bytes, *, where: str) -> bytes:
    """The first regular file in a tar stream."""
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
            for member in tar:
                if member.isfile():
                    f = tar.extractfile(member)
                    assert f is not None
                    return f.read()
    except tarfile.TarError as exc:
        raise SandboxError(f"cannot read {where}: bad tar stream ({exc})") from None
    raise SandboxError(f"cannot read {where}: the tar stream held no file")
