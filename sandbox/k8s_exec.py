"""Commands and files in a pod through the exec subresource (WebSocket, `v5`/`v4.channel.k8s.io`).

The stream carries one channel byte before each frame: 0 stdin, 1 stdout, 2 stderr, 3 the final
`metav1.Status` (`Success`, or `NonZeroExitCode` with an `ExitCode` cause), 4 resize; v5 adds a
CLOSE signal `[255, channel]`. Exec has no cwd, env or timeout of its own, so `wrap_command` builds a
small `sh` script that sets them; the timeout runs inside the pod, because closing the stream does
not kill a process in a container. Files travel as tar over the same stream, as `kubectl cp` does.

The frames are read here, by one loop over all channels (`_read_frames`), not through the client's
`WSClient` buffers: its `read_channel` peeks call `update()`, which pulls frames of *every* channel
into `_channels`, and its `read_all()` then clears them, so frames that arrived between two reads
were dropped (20,000 frames lost 24 bytes, silently). It also appends each frame to a `bytes` per
channel and to a copy of all output, quadratic and unbounded for a large output. The connection
itself is the client's (`create_websocket`: TLS, client certificates, proxies, the subprotocols).
"""

from __future__ import annotations

import io
import json
import re
import secrets
import select
import shlex
import ssl
import tarfile
import threading
import time
from dataclasses import dataclass
from urllib.parse import quote

from openforge.errors import SandboxError
from openforge.sandbox.base import KILL_MARKED_SH, TransientSandboxError
from openforge.sandbox.k8s_throttle import MAX_THROTTLE_RETRIES, backoff_s

CLIENT_GRACE_S = 10.0  # how long past its timeout the client waits for the in-pod `timeout` to report
STALL_S = 60.0  # a frame that started arriving and did not finish in this long: the connection is dead
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FRAME = 1 << 16
V5 = "v5.channel.k8s.io"


class ApiCallError(SandboxError):
    """An API refusal; `status` is the HTTP status (0: no answer), `retry_after` the server's hint (s)."""

    status: int = 0
    retry_after: float | None = None


class TransientApiCallError(ApiCallError, TransientSandboxError):
    """Throttling, a server error, a full quota or an unreachable server: worth another try."""


def api_error(action: str, exc: BaseException) -> ApiCallError:
    """One line from an ApiException (its Status message), a refused WebSocket upgrade or a transport
    error. Throttling, server errors, a full quota and an unreachable server are transient (the start
    is retried); refusals (RBAC, validation, admission, a missing namespace) are not."""
    status = getattr(exc, "status", None) or getattr(exc, "status_code", None)
    body = getattr(exc, "body", None) or getattr(exc, "resp_body", None)
    headers = getattr(exc, "headers", None) or getattr(exc, "resp_headers", None) or {}
    message = ""
    if body:
        try:
            message = json.loads(body).get("message", "")
        except (ValueError, AttributeError):
            message = str(body)[:300]
    if status:
        reason = getattr(exc, "reason", None) or getattr(exc, "status_message", None) or ""
        detail = f"HTTP {status} {reason}".strip()
        transient = status in (429, 500, 502, 503, 504) or (status == 403 and "exceeded quota" in message)
        kind = TransientApiCallError if transient else ApiCallError
        err = kind(f"{action}: {detail}" + (f": {message}" if message else ""))
        err.status = int(status)
        err.retry_after = _retry_after(headers)
        return err
    return TransientApiCallError(f"{action}: {getattr(exc, 'reason', None) or exc}")


def _retry_after(headers) -> float | None:  # type: ignore[no-untyped-def]
    try:
        value = {k.lower(): v for k, v in dict(headers).items()}.get("retry-after")
        return None if value is None else max(0.0, float(value))
    except (TypeError, ValueError):
        return None  # an HTTP-date form: fall back to our own backoff


def is_not_found(exc: BaseException) -> bool:
    return (getattr(exc, "status", None) or getattr(exc, "status_code", None)) == 404


@dataclass
class RawExec:
    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool
    truncated: bool
    duration_s: float


def _capper(limit: int) -> str:
    """Keep the first limit+1 bytes (the client sees that more existed), read and drop the rest: the
    command neither blocks on a full pipe nor dies of SIGPIPE, and the rest never leaves the pod."""
    return f"{{ head -c {limit + 1}; cat >/dev/null; }}"


def wrap_command(command: str | list[str], *, cwd: str, env: dict[str, str] | None, timeout: float,
                 stdin_len: int | None, limit: int | None = None) -> list[str]:
    """The argv sent to the exec subresource: `sh -c` that cds, sets env, runs the command under
    `timeout`, kills what it left behind, and exits with the command's status.

    Stdin is read through `head -c N`: the v4 channel protocol cannot close stdin, so the command
    would never see EOF; with a known length it does on both v4 and v5.
    `timeout` (not --foreground) puts the command in its own process group and signals the group at
    the deadline; -k escalates to KILL for what ignores TERM. Processes that outlive the command (in
    the background, or setsid) carry the exec's marker and are killed before the exec returns, as on
    the local and docker backends; otherwise they would hold the output stream open.
    With `limit`, stdout and stderr each pass through `_capper` inside the pod: 256 MiB printed with a
    1 MiB limit sends 1 MiB (+1 byte) over the network, not 256. The status comes back on fd 5
    (the command has neither 5 nor 6, so a background child cannot hold the result open).
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
    reap = f"set -- {shlex.quote(marker)}; {KILL_MARKED_SH}"
    head = f"cd {shlex.quote(cwd)} || exit 1\n"
    if limit is None:
        return ["sh", "-c", f"{head}{run}\nrc=$?\n{reap}\nexit $rc"]
    cap = _capper(limit)
    body = (f"exec 6>&1\nrc=$( {{ {{ {{ {{ {run}; }} 5>&- 6>&-; rc=$?; {reap}; echo $rc >&5; }} "
            f"2>&1 1>&3 3>&- | {cap} >&2; }} 3>&1 | {cap} >&6; }} 5>&1 )\nexit ${{rc:-1}}")
    return ["sh", "-c", head + body]


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

    def add(self, data: bytes | memoryview) -> None:
        room = len(data) if self.limit is None else max(0, self.limit - len(self.buf))
        self.buf += data[:room]
        self.dropped += len(data) - min(room, len(data))


def open_exec_socket(api_client, *, pod: str, namespace: str, container: str, argv: list[str],  # type: ignore[no-untyped-def]
                     stdin: bool):
    """The exec WebSocket, opened by the client's own `create_websocket` with the credentials the
    shared `api_client` would send (a refreshed token included). No `stream()`: it swaps
    `api_client.call_api` for the length of the call, which a client shared by threads cannot allow."""
    from kubernetes.stream.ws_client import create_websocket, get_websocket_url

    cfg = api_client.configuration
    path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(pod, safe='')}/exec"
    query = [("command", list(argv)), ("container", container), ("stderr", "true"),
             ("stdin", "true" if stdin else "false"), ("stdout", "true"), ("tty", "false")]
    headers: dict[str, str] = {}
    api_client.update_params_for_auth(headers, [], ["BearerToken"], path, "GET", None)
    ws = create_websocket(cfg, get_websocket_url(cfg.host + path, query), headers)
    ws.settimeout(STALL_S)
    return ws


def subprotocol(ws) -> str:  # type: ignore[no-untyped-def]
    """The negotiated subprotocol (websocket-client leaves `subprotocol` unset when the header is
    passed by hand, as create_websocket does)."""
    found = getattr(ws, "subprotocol", None)
    if found:
        return found
    for key, value in (ws.getheaders() or {}).items():
        if key.lower() == "sec-websocket-protocol":
            return value
    return ""


def run_exec_stream(api_client, *, pod: str, namespace: str, container: str, argv: list[str],  # type: ignore[no-untyped-def]
                    timeout: float, stdin: bytes | None, limit: int | None, stopped: threading.Event) -> RawExec:
    """One exec, blocking (run it in the backend's executor)."""
    t0 = time.monotonic()
    for attempt in range(MAX_THROTTLE_RETRIES + 1):
        try:
            ws = open_exec_socket(api_client, pod=pod, namespace=namespace, container=container, argv=argv,
                                  stdin=stdin is not None)
            break
        except Exception as exc:
            err = api_error(f"exec in pod {pod}", exc)
            # A throttled upgrade started nothing in the pod: safe to send again.
            if err.status not in (429, 503) or attempt == MAX_THROTTLE_RETRIES:
                raise err from None
            time.sleep(backoff_s(attempt, err.retry_after))
    out, err, status = _Capture(limit), _Capture(limit), bytearray()
    try:
        if stdin is not None:
            for i in range(0, len(stdin), _FRAME):
                ws.send_binary(b"\x00" + stdin[i:i + _FRAME])
            if subprotocol(ws) == V5:
                ws.send_binary(bytes([255, 0]))  # CLOSE stdin; on v4 `head -c N` ends it instead
        hard_timeout = not _read_frames(ws, out, err, status, deadline=t0 + timeout + CLIENT_GRACE_S,
                                        stopped=stopped, pod=pod)
    except SandboxError:
        raise
    except Exception as exc:
        raise api_error(f"exec in pod {pod}", exc) from None
    finally:
        ws.close(timeout=1)
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


def _read_frames(ws, out: _Capture, err: _Capture, status: bytearray, *, deadline: float,  # type: ignore[no-untyped-def]
                 stopped: threading.Event, pod: str) -> bool:
    """Every frame of every channel, in arrival order, until the server closes (True) or the deadline
    passes (False). Nothing is buffered in between: each frame goes straight to its capture."""
    from websocket import ABNF

    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        if stopped.is_set():
            raise SandboxError(f"pod {pod} was stopped during exec")
        if not _readable(ws.sock, min(0.25, remaining)):
            continue
        opcode, frame = ws.recv_data_frame(True)
        if opcode == ABNF.OPCODE_CLOSE:
            return True
        if opcode not in (ABNF.OPCODE_BINARY, ABNF.OPCODE_TEXT) or not frame.data:
            continue  # ping/pong, or the empty frame of no channel
        data = frame.data if isinstance(frame.data, (bytes, bytearray)) else frame.data.encode()
        channel, payload = data[0], memoryview(data)[1:]
        if channel == 1:
            out.add(payload)
        elif channel == 2:
            err.add(payload)
        elif channel == 3:
            status += payload
        # 255 (v5 CLOSE of a channel by the server) and anything else carry no output.


def _readable(sock, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    # A TLS record decrypted whole may hold the next frames already: invisible to poll().
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(timeout * 1000))


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


GUI_TOOLS_MISSING = 45
# Before the site's forwarder starts (sandbox/kubernetes.py `_prepare_gui`; $1 the old forwarder's token,
# $2 the chromium names to look for or "", $3... the forwarder's `-c` source and arguments): the image has what a GUI exec needs, and a forwarder of an
# earlier attach (its token in its argv, $1) no longer holds the port. Then the forwarder itself
# (python3 -c, as docker's): it binds 127.0.0.1:8080, forks a server and exits 0.
GUI_START_SCRIPT = (
    'missing=""; for t in python3 Xvfb xdotool; do command -v $t >/dev/null || missing="$missing $t"; done; '
    'command -v python3 >/dev/null && { python3 -I -c "import PIL" 2>/dev/null || missing="$missing Pillow"; }; '
    'if [ -n "$2" ]; then found=""; for b in $2; do command -v $b >/dev/null && found=1; done; '
    '[ -n "$found" ] || missing="$missing chromium"; fi; '
    f'if [ -n "$missing" ]; then echo "lacks$missing" >&2; exit {GUI_TOOLS_MISSING}; fi; '
    'if [ -n "$1" ]; then for p in /proc/[0-9]*; do [ "${p#/proc/}" = "$$" ] && continue; '
    'grep -qF -- "$1" $p/cmdline 2>/dev/null && kill -9 ${p#/proc/} 2>/dev/null; done; fi; '
    '[ -n "$3" ] || exit 0; shift 2; exec python3 -I -c "$@"'
)
