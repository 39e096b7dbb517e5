"""The Docker backend: one container per rollout, driven through the Docker Engine API (docker SDK).

The container runs `sleep` under docker-init and does nothing else; every `exec` is an exec instance
(`exec_create` + `exec_start(stream=True, demux=True)`), read frame by frame so the output cap holds
however much a command prints. Files go in and out as tar archives (`put_archive` / `get_archive`).
The SDK is blocking, so each call runs in a thread (`asyncio.to_thread`).

Timeouts are enforced from the host: at the deadline a second exec kills every process in the
container whose environment carries this exec's marker (`OPENFORGE_EXEC=<id>`), which catches the
children it started too; `stop()` removes the container with force (SIGKILL to all of it).

Everything in the container runs as the image's `forge` user (uid/gid 1000, as the Kubernetes pods),
with every capability dropped, `no-new-privileges` and a read-only root: the working directory, $HOME
and /tmp are anonymous volumes (seeded from the image, which gives the user those folders; removed
with the container). The network is `none` by default: the proxy's unix socket is bound in and a
forwarder serves it on the container's 127.0.0.1 (`proxy_url`).
"""

from __future__ import annotations

import asyncio
import io
import os
import posixpath
import secrets
import stat
import tarfile
import time
from typing import Any

from openforge.config import DockerSandboxConfig
from openforge.errors import SandboxError
from openforge.paths import forge_home
from sandbox.base import (LABEL_HOME, container_path, ExecResult, SandboxBase, SandboxFileNotFound, SandboxInfo,
                          TransientSandboxError, sandbox_labels)
from sandbox.images import SANDBOX_HOME, SANDBOX_UID

BUILD_HINT = "forge sandbox build-image"
_FOREVER = "2147483647"  # `sleep infinity` is GNU-only; a big number works in busybox too
# Kills every process (but this shell) whose environ holds the marker $1; POSIX sh + tr + grep, so
# busybox images work too.
_KILL_MARKED = ('for p in /proc/[0-9]*; do [ "${p#/proc/}" = "$$" ] && continue; tr "\\0" "\\n" < $p/environ '
                '2>/dev/null | grep -qx "$1" && kill -9 ${p#/proc/} 2>/dev/null; done; true')
# Runs the command, then kills what it left in the background, in the same exec (no extra round trip),
# so background processes end with their exec as on the local backend.
# Kills every process but PID 1 (docker-init), the container's keeper ($1) and this shell, until none
# is left: a process that forks while being killed is caught by the next pass.
_KILL_ALL = ('for pass in 1 2 3 4 5; do n=0; for p in /proc/[0-9]*; do q=${p#/proc/}; '
             '[ "$q" = 1 ] || [ "$q" = "$1" ] || [ "$q" = "$$" ] && continue; '
             'kill -9 $q 2>/dev/null && n=1; done; [ $n = 0 ] && break; sleep 0.05; done; true')
_RUN_THEN_REAP = '"$@"; rc=$?; set -- "OPENFORGE_EXEC=$OPENFORGE_EXEC"; ' + _KILL_MARKED + '; exit $rc'


def connect(base_url: str = "", timeout: float = 30) -> Any:
    """A docker SDK client that has answered a ping, or a SandboxError saying where it looked."""
    try:
        import docker
    except ImportError:
        raise SandboxError("the docker SDK is not installed (pip install docker); use sandbox.type = \"local\"") from None
    url = base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        client = docker.DockerClient(base_url=url, timeout=timeout)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure here means "no engine", said plainly
        why = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise SandboxError(f"no Docker engine reachable at {url} ({why}); use sandbox.type = \"local\" or "
                           "start Docker") from None
    return client


class DockerSandbox(SandboxBase):
    def __init__(self, config: DockerSandboxConfig, *, run_id: str, rollout_id: str,
                 proxy_socket: str | None = None) -> None:
        self.config = config
        self.cfg = config
        self.start_retries = config.start_retries
        self.labels = {**sandbox_labels(run_id, rollout_id), LABEL_HOME: str(forge_home())}
        self.info = SandboxInfo(backend="docker", sandbox_id="", workdir=config.workdir, home=SANDBOX_HOME,
                                labels=self.labels)
        # The only folders the container's user can write (the root is read-only), each a volume.
        self.writable = tuple(dict.fromkeys((config.workdir.rstrip("/") or "/", SANDBOX_HOME, "/tmp")))
        self.name = f"openforge-{rollout_id}"
        self._client: Any = None
        self._container: Any = None
        self._keeper_pid = ""  # the `sleep` that keeps the container up: the one process kill_all spares
        self.volume_names: list[str] = []  # its anonymous volumes (workdir, HOME, /tmp), removed with it
        self.proxy_socket = str(proxy_socket) if proxy_socket else None
        self.proxy_url: str | None = None

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._container is not None:
            return
        self._client = await asyncio.to_thread(connect, self.cfg.base_url)
        self._container = await asyncio.to_thread(self._create)
        self.info.sandbox_id = self._container.id[:12]
        self.volume_names = [m["Name"] for m in self._container.attrs.get("Mounts", []) if m.get("Type") == "volume"]
        # Right after start the keeper is PID 1's only child; an orphan reparented to PID 1 later is not.
        found = await self.exec(["sh", "-c", 'cat /proc/1/task/1/children && for d; do [ -w "$d" ] || echo "$d"; done',
                                 "sh", *self.writable], timeout=30)
        self._keeper_pid = found.stdout.split()[0] if found.exit_code == 0 and found.stdout.split() else ""
        if not self._keeper_pid:
            raise SandboxError(f"container {self.name}: cannot find its keeper process ({found.stderr.strip()})")
        if found.stdout.split()[1:]:
            raise SandboxError(f"image {self.cfg.image}: {', '.join(found.stdout.split()[1:])} not writable by uid "
                               f"{SANDBOX_UID}, the sandbox's user; build the image with `{BUILD_HINT}` "
                               f"(or give uid {SANDBOX_UID} those folders in yours)")
        if self._forwarding:
            await self._start_forwarder()

    async def kill_all(self) -> None:
        """Kill every process in the container but docker-init and the keeper, by /proc scan inside the
        container's pid namespace: setsid, `env -i` and double forks cannot hide from it. It runs as the
        same user as everything else there, which no process in it can leave (no capabilities, no
        new privileges), so every one of them can be killed."""
        if self._container is None:
            return
        eid = await asyncio.to_thread(self._client.api.exec_create, self._container.id,
                                      ["sh", "-c", _KILL_ALL, "sh", self._keeper_pid])
        await asyncio.to_thread(self._client.api.exec_start, eid["Id"])

    def _create(self) -> Any:
        import docker.errors

        try:
            self._client.images.get(self.cfg.image)
        except docker.errors.ImageNotFound:
            raise SandboxError(f"image {self.cfg.image} not found; build it with `{BUILD_HINT}` "
                               "(or set sandbox.image)") from None
        from docker.types import Mount

        if self._forwarding:
            _open_socket_to(self.proxy_socket or "")
        try:
            container = self._client.containers.run(
                self.cfg.image, ["sleep", _FOREVER], name=self.name, detach=True, init=True,
                labels=self.labels, working_dir=self.config.workdir, network_mode=self.cfg.network,
                user=f"{SANDBOX_UID}:{SANDBOX_UID}", cap_drop=["ALL"], security_opt=["no-new-privileges"],
                read_only=True, environment={"HOME": SANDBOX_HOME, "TMPDIR": "/tmp"},
                # Anonymous volumes: seeded from the image (ownership included), removed with the container.
                mounts=[Mount(path, None, type="volume") for path in self.writable],
                mem_limit=f"{self.cfg.memory_mb}m", memswap_limit=f"{self.cfg.memory_mb}m",
                nano_cpus=int(self.cfg.cpus * 1e9), pids_limit=self.cfg.pids_limit, volumes=self._volumes())
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # a leftover container of the same rollout (crashed run)
                self._remove(self.name)
                raise TransientSandboxError(f"container {self.name} already existed; removed it") from None
            raise TransientSandboxError(f"docker could not start a container from {self.cfg.image}: "
                                        f"{exc.explanation or exc}") from None
        return container

    def _volumes(self) -> dict[str, dict[str, str]]:
        """The proxy socket's folder (it holds only the socket), bound in when the container has no network."""
        if not self._forwarding:
            return {}
        return {os.path.dirname(self.proxy_socket or ""): {"bind": "/run/forge", "mode": "rw"}}

    @property
    def _forwarding(self) -> bool:
        return bool(self.proxy_socket) and self.cfg.network == "none"

    async def _start_forwarder(self) -> None:
        """The forwarder (sandbox/forwarder.py) on the container's 127.0.0.1, run with the image's python3
        in an exec of its own that carries no exec marker, so no exec's reaper ends it (kill_all does).
        Its source goes in as `-c`: nothing to write on the read-only root, nothing the agent can edit."""
        from sandbox.local import FORWARDER, PROXY_PORT

        check = await self.exec("command -v python3", timeout=30)
        if check.exit_code != 0:
            raise SandboxError(f"image {self.cfg.image} has no python3 to forward the proxy's socket "
                               "(use the python image: forge sandbox build-image)")
        eid = await asyncio.to_thread(self._client.api.exec_create, self._container.id,
                                      ["python3", "-I", "-c", FORWARDER.read_text(), "--socket",
                                       f"/run/forge/{os.path.basename(self.proxy_socket or '')}",
                                       "--port", str(PROXY_PORT), "--"])
        await asyncio.to_thread(self._client.api.exec_start, eid["Id"])  # returns once the port is bound
        self.proxy_url = f"http://127.0.0.1:{PROXY_PORT}"

    async def stop(self) -> None:
        if self._client is None:
            return
        try:
            await asyncio.to_thread(self._remove, self._container.id if self._container else self.name)
        finally:
            self._container = None
            client, self._client = self._client, None
            await asyncio.to_thread(client.close)

    def _remove(self, ident: str) -> None:
        import docker.errors

        try:
            self._client.api.remove_container(ident, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409 = removal already in progress
                raise SandboxError(f"could not remove container {ident}: {exc.explanation or exc}") from None

    def _need(self) -> Any:
        if self._container is None:
            raise SandboxError("the sandbox is not started (use `async with` or call start())")
        return self._container

    # -- exec --------------------------------------------------------------------------------------
    async def exec(self, command: str | list[str], *, timeout: float, env: dict[str, str] | None = None,
                   cwd: str | None = None, max_output: int | None = None, stdin: bytes | None = None,
                   ) -> ExecResult:
        container = self._need()
        cap = max_output or self.config.max_output_bytes
        marker = f"OPENFORGE_EXEC={secrets.token_hex(8)}"
        argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
        if stdin is not None:
            # Exec stdin needs a hijacked socket; a file redirect gives the same bytes more simply.
            path = f"/tmp/.openforge-stdin-{marker[-16:]}"
            await asyncio.to_thread(self._put, path, stdin, 0o600)
            argv = ["sh", "-c", f'"$@" < {path}; rc=$?; rm -f {path}; exit $rc', "sh", *argv]
        argv = ["sh", "-c", _RUN_THEN_REAP, "sh", *argv]
        environment = {**(env or {}), "OPENFORGE_EXEC": marker.partition("=")[2]}
        workdir = self._resolve(cwd) if cwd else self.config.workdir
        start = time.monotonic()
        exec_id = await asyncio.to_thread(self._client.api.exec_create, container.id, argv,
                                          environment=environment, workdir=workdir)
        exec_id = exec_id["Id"]
        reader = _CappedReader(cap)
        task = asyncio.ensure_future(asyncio.to_thread(reader.run, self._client.api, exec_id))
        timed_out = False
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout)
        except asyncio.TimeoutError:
            timed_out = True
            await asyncio.to_thread(self._kill_marked, marker)
            await asyncio.wait({task}, timeout=5)
        except asyncio.CancelledError:
            await asyncio.to_thread(self._kill_marked, marker)
            raise
        if reader.error is not None and not timed_out:
            raise SandboxError(f"exec in container {self.info.sandbox_id} failed: {reader.error}")
        code = 124
        if not timed_out:
            inspect = await asyncio.to_thread(self._client.api.exec_inspect, exec_id)
            code = inspect.get("ExitCode")
            code = -1 if code is None else code
        return ExecResult(exit_code=code, stdout=reader.text(0), stderr=reader.text(1), timed_out=timed_out,
                          truncated=reader.truncated, duration_s=time.monotonic() - start)

    def _kill_marked(self, marker: str) -> None:
        try:
            eid = self._client.api.exec_create(self._container.id, ["sh", "-c", _KILL_MARKED, "sh", marker])
            self._client.api.exec_start(eid["Id"])
        except Exception:  # noqa: BLE001 - a container already gone has nothing left to kill
            pass

    # -- files -------------------------------------------------------------------------------------
    def _resolve(self, path: str) -> str:
        return container_path(self.config.workdir, path)

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        self._need()
        await asyncio.to_thread(self._put, self._resolve(path), data, mode)

    def _put(self, full: str, data: bytes, mode: int) -> None:
        """Write one file as the sandbox's user, by a tar extracted in the writable folder that holds it
        (the root is read-only). Its missing parents come as members of their own, owned by the user:
        left to the engine they would be root's, and the agent could not write in them."""
        base = next((d for d in self.writable if full == d or full.startswith(d.rstrip("/") + "/")), None)
        rel = posixpath.relpath(full, base) if base else ""
        if base is None or rel == ".":
            raise SandboxError(f"cannot write {full}: the container's root is read-only; the sandbox's user "
                               f"writes only in {', '.join(self.writable)}")
        now = int(time.time())
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            parts = rel.split("/")
            for i in range(1, len(parts)):
                folder = tarfile.TarInfo("/".join(parts[:i]))
                folder.type, folder.mode, folder.mtime = tarfile.DIRTYPE, 0o755, now
                folder.uid = folder.gid = SANDBOX_UID
                tar.addfile(folder)
            member = tarfile.TarInfo(rel)
            member.size, member.mode, member.mtime = len(data), mode, now
            member.uid = member.gid = SANDBOX_UID
            tar.addfile(member, io.BytesIO(data))
        if not self._client.api.put_archive(self._container.id, base, buf.getvalue()):
            raise SandboxError(f"could not write {full} into container {self.info.sandbox_id}")

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        container = self._need()
        full = self._resolve(path)
        return await asyncio.to_thread(self._read, container.id, full, max_bytes)

    def _read(self, cid: str, full: str, max_bytes: int | None) -> bytes:
        import docker.errors

        try:
            stream, stat = self._client.api.get_archive(cid, full)
        except docker.errors.NotFound:
            raise SandboxFileNotFound(f"{full}: no such file in the sandbox") from None
        # get_archive streams a tar; read it as a stream so a huge file is never held whole.
        with tarfile.open(fileobj=_IterReader(stream), mode="r|") as tar:
            for member in tar:
                if not member.isfile():
                    raise SandboxError(f"{full} is not a regular file")
                handle = tar.extractfile(member)
                return handle.read(max_bytes if max_bytes is not None else -1) if handle else b""
        raise SandboxFileNotFound(f"{full}: no such file in the sandbox")


def _open_socket_to(path: str) -> None:
    """Let the container's user (another uid) reach the proxy's socket through its bound folder:
    the folder searchable, the socket connectable. It holds nothing else, and every request still
    needs a rollout's key, exactly as on the proxy's TCP port, which any local user can reach."""
    folder = os.path.dirname(path)
    try:
        os.chmod(folder, stat.S_IMODE(os.stat(folder).st_mode) | 0o011)
        if os.path.exists(path):
            os.chmod(path, stat.S_IMODE(os.stat(path).st_mode) | 0o006)
    except OSError as exc:
        raise SandboxError(f"cannot open the proxy socket {path} to the container's user (uid {SANDBOX_UID}): "
                           f"{exc.strerror}") from None


class _CappedReader:
    """Drains an exec's multiplexed stream in a thread, keeping at most `cap` bytes per stream."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.kept = (bytearray(), bytearray())
        self.truncated = False
        self.error: str | None = None

    def run(self, api: Any, exec_id: str) -> None:
        stream = None
        try:
            stream = api.exec_start(exec_id, stream=True, demux=True)  # a CancellableStream
            for out, err in stream:
                for i, chunk in ((0, out), (1, err)):
                    if chunk:
                        room = self.cap - len(self.kept[i])
                        if len(chunk) > room:
                            self.truncated = True
                        if room > 0:
                            self.kept[i].extend(chunk[:room])
        except Exception as exc:  # noqa: BLE001 - reported by exec(), unless the kill caused it
            self.error = str(exc) or type(exc).__name__
        finally:
            if stream is not None:
                stream.close()  # else the hijacked socket stays open until a GC cycle finds it

    def text(self, i: int) -> str:
        return bytes(self.kept[i]).decode("utf-8", errors="replace")


class _IterReader(io.RawIOBase):
    """A file object over the byte chunks `get_archive` yields (tarfile's stream mode reads it)."""

    def __init__(self, chunks: Any) -> None:
        self._it = iter(chunks)
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            try:
                self._buf = next(self._it)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n], self._buf = self._buf[:n], self._buf[n:]
        return n
