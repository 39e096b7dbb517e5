"""The Docker backend: one container per rollout, driven through the Docker Engine API (docker SDK).

The container runs `sleep` under docker-init and does nothing else; every `exec` is an exec instance
(`exec_create` + `exec_start(stream=True, demux=True)`), read frame by frame so the output cap holds
however much a command prints. Files go in and out as tar archives (`put_archive` / `get_archive`).
The SDK is blocking, so each call runs in a thread (`asyncio.to_thread`).

Timeouts are enforced from the host: at the deadline a second exec kills every process in the
container whose environment carries this exec's marker (`OPENFORGE_EXEC=<id>`), which catches the
children it started too; `stop()` removes the container with force (SIGKILL to all of it).

Everything the sandbox runs in the container runs as the image's `forge` user (uid/gid 1000, as the
Kubernetes pods); docker-init and the keeper `sleep` run as uid 0, so the agent cannot signal them
(with no CAP_KILL) and stop its own container. Every capability is dropped, with `no-new-privileges`
and a read-only root: the working directory, $HOME and /tmp are anonymous volumes (seeded from the
image, which gives the user those folders; removed with the container). A fourth volume, /forge-grader, is
root's: the user cannot write in it, and forge puts a grader's files there (`grader_folder`). The network is `none` by
default: the proxy's unix socket is bound in and a forwarder serves it on the container's 127.0.0.1
(`proxy_url`). With `sandbox.allow_internet` a `none` container is on forge's egress bridge instead
(`openforge-egress`, made once and kept: a network namespace of its own with a route out through the
host's NAT, and no traffic between the containers on it); the proxy is still reached through its socket.

GUI tasks (sandbox/gui.py, docs/gui.md "Docker"): created with a task site's `site_socket`, the
container gets the socket's own private folder bound read-only at /run/forge-site (a unix socket stays
connectable on a read-only mount; nothing can be added to or removed from the folder); every container
has gui.py bound read-only at /opt/forge/gui.py. An online task's GUI (its live start page, under
`sandbox.allow_internet`) has no site: no forwarder, the image checked at the first GUI exec instead of
at start. While `attach_gui(spec)` holds a spec, each exec runs as

    python3 -I -c <forwarder.py> --socket /run/forge-site/site.sock --port 8080 --
      python3 -I /opt/forge/gui.py run --size WxH --kiosk URL -- CMD

in the image's python3 (the browser image has chromium, Xvfb, xdotool and python3-pil): Xvfb's socket
lands in the container's /tmp, its abstract socket in the container's own network namespace, and
everything the exec started carries its marker, so it ends with the exec (and with `kill_all`).

Host servers for the agent (a task's MCP tools server, its services' fronts: `expose_socket`): the
container is created with an empty host folder bound read-only at /run/forge-exposed; exposing hard-
links the server's socket into it (a link to the socket's inode: connectable from inside, nothing the
container can change) and each following exec runs behind a forwarder of it on its own 127.0.0.1:PORT,
until `withdraw_sockets` unlinks them (before the graders' execs).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import posixpath
import secrets
import stat
import tarfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit
from typing import Any

from openforge.config import DockerSandboxConfig
from openforge.errors import SandboxError
from openforge.paths import forge_home
from openforge.sandbox.base import (EMPTY_GRADER_SH, GRADER_DIR, KILL_ALL_SH, KILL_MARKED_SH, LABEL_HOME, LABEL_ROLLOUT, container_path, ExecResult,
                          IsolationReport, SandboxBase, SandboxFileNotFound, SandboxInfo, SandboxPathRefused, TransientSandboxError, sandbox_labels)
from openforge.sandbox.compose import ComposeService, remove_services, start_services
from openforge.sandbox.gui import CHROMIUM_NAMES, SITE_PORT, SITE_URL, GuiSpec
from openforge.sandbox.docker_engine import connect, engine_url, probe
from openforge.sandbox.gc import owned_tempdir, remove_owned
from openforge.sandbox.container_images import SANDBOX_HOME, SANDBOX_UID, image_tag
from openforge.sandbox.limits import TaskLimits, host_cpus

BUILD_HINT = "forge sandbox build-image"
GUI_MODULE = Path(__file__).with_name("gui.py")
GUI_INSIDE = "/opt/forge/gui.py"  # a read-only file bind (the root stays read-only)
SITE_DIR_INSIDE = "/run/forge-site"  # the site socket's own folder, bound read-only
EXPOSED_DIR_INSIDE = "/run/forge-exposed"  # host servers' sockets (`expose_socket`), bound read-only
# What a GUI exec needs from the image: prints `missing NAME` for each absent, then `python PATH` (the
# python3 with Pillow that GUI execs get as FORGE_PYTHON). chromium may be under any of gui.py's names;
# a desktop task's display (a start script, no browser) needs none (_DESKTOP_CHECK).
_TOOLS_CHECK = 'for p in Xvfb xdotool python3; do command -v $p >/dev/null || echo missing $p; done; '
_REST_CHECK = ('python3 -I -c "from PIL import ImageGrab" 2>/dev/null || echo missing python3-pil; '
               'echo python "$(command -v python3)"; true')
_DESKTOP_CHECK = _TOOLS_CHECK + _REST_CHECK
_GUI_CHECK = (_TOOLS_CHECK + 'found=; for c in ' + " ".join(CHROMIUM_NAMES) + '; do command -v $c >/dev/null && '
              'found=1; done; [ -n "$found" ] || echo missing chromium; ' + _REST_CHECK)
# Every exec runs as the sandbox's user; only docker-init and the keeper run as uid 0 (with no
# capability: no CAP_KILL, so nothing of uid 1000 can signal them; `kill -9 -1` from the agent would
# otherwise end the keeper, so the container, and turn its failure into an infrastructure one).
EXEC_USER = f"{SANDBOX_UID}:{SANDBOX_UID}"
_FOREVER = "2147483647"  # `sleep infinity` is GNU-only; a big number works in busybox too
# Runs the command, then kills what it left in the background, in the same exec (no extra round trip),
# so background processes end with their exec as on the local backend.
_RUN_THEN_REAP = '"$@"; rc=$?; set -- "OPENFORGE_EXEC=$OPENFORGE_EXEC"; ' + KILL_MARKED_SH + '; exit $rc'
# sandbox.allow_internet: a bridge with inter-container traffic off (`enable_icc`), so a rollout with the
# internet still cannot reach another rollout's container; Docker's default bridge lets them talk.
EGRESS_NETWORK = "openforge-egress"
_EGRESS_OPTIONS = {"com.docker.network.bridge.enable_icc": "false"}
_egress_lock = threading.Lock()  # containers start on threads: the network is made once


def container_network(config: DockerSandboxConfig) -> str:
    """The container's network mode: `sandbox.network`, or forge's egress bridge in place of "none"
    when `sandbox.allow_internet` lets the run's tasks reach the internet."""
    return EGRESS_NETWORK if config.allow_internet and config.network == "none" else config.network


def ensure_egress_network(client: Any) -> None:
    """Make forge's egress bridge on the engine unless it is there (it is kept for later runs)."""
    import docker.errors

    def found() -> bool:
        return any(n.name == EGRESS_NETWORK for n in client.networks.list(names=[EGRESS_NETWORK]))

    with _egress_lock:
        if found():
            return
        try:
            client.networks.create(EGRESS_NETWORK, driver="bridge", options=_EGRESS_OPTIONS,
                                   labels={"openforge.network": "egress"})
        except docker.errors.APIError as exc:
            if not found():  # another process made it meanwhile: fine; else a real failure
                raise SandboxError(f"cannot create the Docker network {EGRESS_NETWORK} for sandbox.allow_internet: "
                                   f"{exc.explanation or exc}") from None


class DockerSandbox(SandboxBase):
    supports_gui = True  # with the browser image (attach_gui); a task site's socket is bound at creation

    @classmethod
    def check_isolation(cls, config: DockerSandboxConfig) -> IsolationReport:
        return IsolationReport("docker", f"containers with network {container_network(config)!r}")

    @classmethod
    def preflight(cls, config: DockerSandboxConfig) -> None:
        verdict, detail = probe(config)
        if verdict == "warn":  # the engine answers; the image is not on it
            raise SandboxError(f"the sandbox image {config.image} is not on the Docker engine "
                               f"({detail.split(';')[0]}): build it with `forge sandbox build-image`")
        if verdict != "ok":
            why = "the docker SDK is not installed; " if "SDK" in detail else ""
            raise SandboxError(f"no Docker engine reachable at {engine_url(config.base_url)}; {why}use "
                               "sandbox.type = \"local\" or start Docker")

    # Docker's own size cap (`storage_opt`) needs overlay2 on xfs with project quotas and would cover only
    # the container's layer, which is read-only here; a tmpfs volume is not seeded from the image and
    # its pages count against the memory limit.
    storage_enforced_as = ("a cap on each file's size (--ulimit fsize), not on the total written: the writable "
                           "folders are volumes with no size")

    @classmethod
    def with_limits(cls, config: DockerSandboxConfig, limits: TaskLimits) -> DockerSandboxConfig:
        update: dict[str, float | int] = {}
        if limits.cpus is not None:  # the engine refuses more CPUs than the host has
            update["cpus"] = min(limits.cpus, float(host_cpus()))
        if limits.memory_mb is not None:
            update["memory_mb"] = limits.memory_mb
        if limits.storage_mb is not None:  # volumes have no size: no file may outgrow the task's disk
            update["max_file_mb"] = limits.storage_mb
        return config.model_copy(update=update)

    @classmethod
    def with_image(cls, config: DockerSandboxConfig, image: str, workdir: str) -> DockerSandboxConfig:
        return config.model_copy(update={"image": image, "workdir": workdir})

    @classmethod
    def with_services(cls, config: DockerSandboxConfig, services: list[dict[str, Any]]) -> DockerSandboxConfig:
        if config.network != "none":  # the agent joins the services' network in place of "none"
            raise SandboxError(f"this task runs compose services beside the agent: they need sandbox.network = "
                               f"\"none\" (the rollout's own network is made for them), not {config.network!r}")
        return config.model_copy(update={"compose_services": [ComposeService(**s).model_dump() for s in services]})

    def __init__(self, config: DockerSandboxConfig, *, run_id: str, rollout_id: str,
                 proxy_socket: str | Path | None = None, site_socket: str | Path | None = None) -> None:
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
        self.volume_names: list[str] = []  # its anonymous volumes (workdir, HOME, /tmp, the grader's)
        self.proxy_socket = str(proxy_socket) if proxy_socket else None
        self.proxy_url: str | None = None
        # A GUI task's site socket (rollouts/tasks/web/server.py), bound in at create time; `attach_gui` runs
        # the following execs in a display with a browser on it.
        self.site_socket = os.fspath(site_socket) if site_socket else None
        self.gui: GuiSpec | None = None
        self.gui_python = "python3"  # the image's python3 (its path, once start() has checked the image)
        self.gui_image_checked = False  # `_check_gui_image` passed: at start with a site, else at the first GUI exec
        # Host servers for the following execs (`expose_socket`): their sockets hard-linked into a folder
        # bound in at create time, each forwarded to the exec's own 127.0.0.1:port. port -> path inside.
        self.exposed_dir = ""
        self.exposed: dict[int, str] = {}

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._container is not None:
            return
        self._client = await asyncio.to_thread(connect, self.cfg.base_url)
        self._container = await asyncio.to_thread(self._create)
        self.info.sandbox_id = self._container.id[:12]
        self.volume_names = [m["Name"] for m in self._container.attrs.get("Mounts", []) if m.get("Type") == "volume"]
        found = await self.exec(["sh", "-c", 'for d; do [ -w "$d" ] || echo "$d"; done', "sh", *self.writable],
                                timeout=30)
        if found.exit_code != 0:
            raise SandboxError(f"container {self.name}: the start check failed ({found.stderr.strip()})")
        if found.stdout.split():
            raise SandboxError(f"image {self.cfg.image}: {', '.join(found.stdout.split())} not writable by uid "
                               f"{SANDBOX_UID}, the sandbox's user; build the image with `{BUILD_HINT}` "
                               f"(or give uid {SANDBOX_UID} those folders in yours)")
        if self.site_socket:
            await self._check_gui_image()
        if self._forwarding:
            await self._start_forwarder()

    def agent_proxy_url(self, host_url: str) -> str:
        # The forwarder of the proxy's socket, once started; else the host's network (network "host").
        return self.proxy_url or super().agent_proxy_url(host_url)

    def expose_socket(self, host_socket: str, host_url: str, port: int) -> str:
        if self.cfg.network == "host":  # the container shares the host's network
            return host_url
        if not self.exposed_dir:
            raise SandboxError("the sandbox is not started (use `async with` or call start())")
        link = os.path.join(self.exposed_dir, f"{port}.sock")
        try:  # a hard link: a unix socket is reached through any path to its inode, the bound folder's too
            if os.path.lexists(link):
                os.unlink(link)
            os.link(host_socket, link)
            os.chmod(link, 0o666)  # the container's user is uid 1000; the server's own bearer token guards it
        except OSError as exc:
            raise SandboxError(f"cannot hand the socket {host_socket} to container {self.name}: {exc}") from None
        self.exposed[port] = f"{EXPOSED_DIR_INSIDE}/{port}.sock"
        return f"http://127.0.0.1:{port}{urlsplit(host_url).path}"

    def withdraw_sockets(self) -> None:
        for port in self.exposed:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.exposed_dir, f"{port}.sock"))
        self.exposed.clear()

    def attach_gui(self, spec: GuiSpec | None) -> None:
        """Run the following execs with an X display (Xvfb), chromium on `spec.url` and the site's socket
        forwarded to the container's 127.0.0.1:SITE_PORT; None detaches. The site socket is bound when
        the container is created, so a spec must name the same one (`make_sandbox(site_socket=...)`)."""
        if spec is not None and (os.fspath(spec.site_socket) if spec.site_socket else None) != self.site_socket:
            raise SandboxError(f"this container was created with site socket {self.site_socket or '(none)'}, "
                               f"not {spec.site_socket or '(none)'}: pass the task site's socket to "
                               "make_sandbox(site_socket=...) before the sandbox starts")
        self.gui = spec

    async def _check_gui_image(self, desktop: bool = False) -> None:
        """A GUI sandbox's image must hold chromium, Xvfb, xdotool and python3 with Pillow (the browser image;
        a `desktop` task's display needs no chromium: the desktop image), and its network namespace must be its
        own (the display's abstract socket and the site's port live there)."""
        if self.cfg.network == "host":
            raise SandboxError("GUI tasks need a container with a network of its own (its X display and the "
                               "site's port 8080 would be the host's): set sandbox.network = \"none\"")
        found = await self.exec(_DESKTOP_CHECK if desktop else _GUI_CHECK, timeout=60)
        lines = [line.split(" ", 1) for line in found.stdout.splitlines() if " " in line]
        missing = [v for k, v in lines if k == "missing"]
        if found.exit_code != 0:
            missing.append(f"(the check failed: {found.stderr.strip()[:200]})")
        self.gui_python = next((v for k, v in lines if k == "python" and v.startswith("/")), "python3")
        if missing and desktop:
            raise SandboxError(f"image {self.cfg.image} cannot run desktop tasks: no {', '.join(missing)}; build the "
                               f"desktop image with `{BUILD_HINT} --variant desktop --packages PACKAGES` (the Debian "
                               "packages of the task's applications) and set sandbox.image to the tag it prints")
        if missing:
            raise SandboxError(f"image {self.cfg.image} cannot run GUI tasks: no {', '.join(missing)}; build the "
                               f"browser image with `{BUILD_HINT} --variant browser` and set sandbox.image = "
                               f"\"{image_tag('browser')}\"")
        self.gui_image_checked = True

    async def kill_all(self) -> None:
        """Kill every process in the container but docker-init and the keeper: `kill -9 -1` as the
        sandbox's user (KILL_ALL_SH), which every process the agent started is (no capabilities, no new
        privileges) and docker-init and the keeper are not. setsid, `env -i`, double forks and a chain
        of processes that fork and exit faster than a /proc scan (which once let one outlive the
        scan and rewrite the verifier) cannot hide from it. SandboxError when something survives."""
        if self._container is None:
            return

        def run() -> tuple[int | None, bytes]:
            eid = self._client.api.exec_create(self._container.id, ["sh", "-c", KILL_ALL_SH], user=EXEC_USER)
            out = self._client.api.exec_start(eid["Id"])
            return self._client.api.exec_inspect(eid["Id"]).get("ExitCode"), out

        code, out = await asyncio.to_thread(run)
        if code != 0:
            raise SandboxError(f"kill_all in container {self.info.sandbox_id} (exit {code}): "
                               f"{out.decode('utf-8', 'replace').strip()[-300:]}")

    def _create(self) -> Any:
        import docker.errors

        try:
            self._client.images.get(self.cfg.image)
        except docker.errors.ImageNotFound:
            raise SandboxError(f"image {self.cfg.image} not found; build it with `{BUILD_HINT}` "
                               "(or set sandbox.image)") from None
        from docker.types import Mount

        if self._forwarding:
            _open_socket_to(self.proxy_socket or "", "the proxy")
        if self.site_socket:
            _open_socket_to(self.site_socket, "the task site")
        network = container_network(self.cfg)
        if self.cfg.compose_services:  # the rollout's own network, its services on it (sandbox/compose.py)
            network = start_services(self._client, [ComposeService(**s) for s in self.cfg.compose_services],
                                     rollout_id=self.labels[LABEL_ROLLOUT], labels=self.labels,
                                     internet=self.cfg.allow_internet,
                                     limits={"mem_limit": f"{self.cfg.memory_mb}m", "pids_limit": self.cfg.pids_limit,
                                             "nano_cpus": int(self.cfg.cpus * 1e9)})
        elif network == EGRESS_NETWORK:
            ensure_egress_network(self._client)
        try:
            container = self._client.containers.run(
                self.cfg.image, ["sleep", _FOREVER], name=self.name, detach=True, init=True,
                labels=self.labels, working_dir=self.config.workdir, network_mode=network,
                user="0:0", cap_drop=["ALL"], security_opt=["no-new-privileges"],
                read_only=True, environment={"HOME": SANDBOX_HOME, "TMPDIR": "/tmp"},
                # Anonymous volumes: seeded from the image (ownership included), removed with the container.
                # The grader's folder: a volume too, root's (no such folder in the image), so the user cannot
                # write in it; forge writes there by put_archive (grader_folder).
                mounts=[Mount(path, None, type="volume") for path in (*self.writable, GRADER_DIR)],
                mem_limit=f"{self.cfg.memory_mb}m", memswap_limit=f"{self.cfg.memory_mb}m",
                nano_cpus=int(self.cfg.cpus * 1e9), pids_limit=self.cfg.pids_limit, volumes=self._volumes(),
                **self._file_limit())
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # a leftover container of the same rollout (crashed run)
                self._remove(self.name)
                raise TransientSandboxError(f"container {self.name} already existed; removed it") from None
            raise TransientSandboxError(f"docker could not start a container from {self.cfg.image}: "
                                        f"{exc.explanation or exc}") from None
        return container

    def _file_limit(self) -> dict[str, Any]:
        if not self.cfg.max_file_mb:
            return {}
        from docker.types import Ulimit

        size = self.cfg.max_file_mb << 20
        return {"ulimits": [Ulimit(name="fsize", soft=size, hard=size)]}

    def _volumes(self) -> dict[str, dict[str, str]]:
        """The proxy socket's folder (it holds only the socket), bound in when the container has no network;
        a GUI task's site socket folder (only the socket, read-only); gui.py (read-only) in every container,
        since an online task's GUI has no site to tell its container apart at creation."""
        volumes: dict[str, dict[str, str]] = {}
        if self.cfg.network != "host":  # empty until `expose_socket` links a host server's socket in
            self.exposed_dir = self.exposed_dir or owned_tempdir("forge-exposed-")
            os.chmod(self.exposed_dir, 0o755)
            volumes[self.exposed_dir] = {"bind": EXPOSED_DIR_INSIDE, "mode": "ro"}
        if self._forwarding:
            volumes[os.path.dirname(self.proxy_socket or "")] = {"bind": "/run/forge", "mode": "ro"}
        if self.site_socket:
            volumes[os.path.dirname(self.site_socket)] = {"bind": SITE_DIR_INSIDE, "mode": "ro"}
        volumes[str(GUI_MODULE)] = {"bind": GUI_INSIDE, "mode": "ro"}
        return volumes

    @property
    def _forwarding(self) -> bool:
        return bool(self.proxy_socket) and self.cfg.network == "none"

    async def _start_forwarder(self) -> None:
        """The forwarder (sandbox/forwarder.py) on the container's 127.0.0.1, run with the image's python3
        in an exec of its own that carries no exec marker, so no exec's reaper ends it (kill_all does).
        Its source goes in as `-c`: nothing to write on the read-only root, nothing the agent can edit."""
        from openforge.sandbox.local import FORWARDER, PROXY_PORT

        check = await self.exec("command -v python3", timeout=30)
        if check.exit_code != 0:
            raise SandboxError(f"image {self.cfg.image} has no python3 to forward the proxy's socket "
                               "(use the python image: forge sandbox build-image)")
        eid = await asyncio.to_thread(self._client.api.exec_create, self._container.id,
                                      ["python3", "-I", "-c", FORWARDER.read_text(), "--socket",
                                       f"/run/forge/{os.path.basename(self.proxy_socket or '')}",
                                       "--port", str(PROXY_PORT), "--"], user=EXEC_USER)
        await asyncio.to_thread(self._client.api.exec_start, eid["Id"])  # returns once the port is bound
        self.proxy_url = f"http://127.0.0.1:{PROXY_PORT}"

    async def stop(self) -> None:
        if self._client is None:
            return
        try:
            await asyncio.to_thread(self._remove, self._container.id if self._container else self.name)
            if self.cfg.compose_services:  # after the agent's container: it was on their network
                await asyncio.to_thread(remove_services, self._client, self.labels[LABEL_ROLLOUT])
        finally:
            if self.exposed_dir:
                remove_owned(self.exposed_dir)
                self.exposed_dir, self.exposed = "", {}
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
        extra: dict[str, str] = {}
        if self.gui is not None and not self.gui_image_checked:  # a GUI without a site (an online task's
            gui, self.gui = self.gui, None  # live page, a desktop): its image is checked at its first exec,
            try:  # without it
                await self._check_gui_image(desktop=gui.start is not None)
            finally:
                self.gui = gui
        if self.gui is not None:  # the display, the browser and the site's door (sandbox/gui.py)
            argv, extra = self._gui_argv(self.gui, argv)
        from openforge.sandbox.local import FORWARDER

        for port, inside in self.exposed.items():  # each exposed host server's door (sandbox/forwarder.py)
            argv = [self.gui_python, "-I", "-c", FORWARDER.read_text(), "--socket", inside, "--port", str(port),
                    "--", *argv]
        if stdin is not None:
            # Exec stdin needs a hijacked socket; a file redirect gives the same bytes more simply.
            path = f"/tmp/.openforge-stdin-{marker[-16:]}"
            await asyncio.to_thread(self._put, path, stdin, 0o600)
            argv = ["sh", "-c", f'"$@" < {path}; rc=$?; rm -f {path}; exit $rc', "sh", *argv]
        argv = ["sh", "-c", _RUN_THEN_REAP, "sh", *argv]
        environment = {**extra, **(env or {}), "OPENFORGE_EXEC": marker.partition("=")[2]}
        workdir = self._resolve(cwd) if cwd else self.config.workdir
        start = time.monotonic()
        exec_id = await asyncio.to_thread(self._client.api.exec_create, container.id, argv,
                                          environment=environment, workdir=workdir, user=EXEC_USER)
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

    def _gui_argv(self, spec: GuiSpec, argv: list[str]) -> tuple[list[str], dict[str, str]]:
        """`argv` inside gui.py's launcher, behind the site's forwarder, and the environment a GUI exec gets."""
        from openforge.sandbox.local import FORWARDER

        python = self.gui_python
        argv = [python, "-I", GUI_INSIDE, *spec.launcher_args(), *argv]
        env = {"FORGE_GUI": GUI_INSIDE, "FORGE_PYTHON": python}
        if spec.site_socket:
            argv = [python, "-I", "-c", FORWARDER.read_text(), "--socket",
                    f"{SITE_DIR_INSIDE}/{os.path.basename(spec.site_socket)}", "--port", str(SITE_PORT), "--", *argv]
            env["FORGE_SITE_URL"] = SITE_URL
        return argv, env

    def _kill_marked(self, marker: str) -> None:
        try:
            eid = self._client.api.exec_create(self._container.id, ["sh", "-c", KILL_MARKED_SH, "sh", marker],
                                               user=EXEC_USER)
            self._client.api.exec_start(eid["Id"])
        except Exception:  # noqa: BLE001 - a container already gone has nothing left to kill
            pass

    # -- files -------------------------------------------------------------------------------------
    def _resolve(self, path: str) -> str:
        return container_path(self.config.workdir, path)

    async def grader_folder(self) -> str:
        """A folder of the sandbox's user, named afresh, in GRADER_DIR: a volume of root's, where the agent could
        make nothing (and what earlier gradings left in it is emptied first)."""
        self._need()
        emptied = await self.exec(EMPTY_GRADER_SH, timeout=120)
        if emptied.exit_code != 0:
            raise SandboxError(f"cannot empty the grader's folder {GRADER_DIR} (exit {emptied.exit_code}): "
                               f"{emptied.stderr.strip()[:300]}")
        folder = f"{GRADER_DIR}/{secrets.token_hex(6)}"
        await asyncio.to_thread(self._put, folder, None, 0o755)
        return folder

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        self._need()
        await asyncio.to_thread(self._put, self._resolve(path), data, mode)

    def _put(self, full: str, data: bytes | None, mode: int) -> None:
        """Write one file (None: a folder) as the sandbox's user, by a tar extracted in the writable folder
        that holds it (the root is read-only) or in GRADER_DIR. Its missing parents come as members of their
        own, owned by the user: left to the engine they would be root's, and the agent could not write in them."""
        base = next((d for d in (*self.writable, GRADER_DIR) if full == d or full.startswith(d.rstrip("/") + "/")),
                    None)
        rel = posixpath.relpath(full, base) if base else ""
        if base is None or rel == ".":
            raise SandboxError(f"cannot write {full}: the container's root is read-only; the sandbox's user "
                               f"writes only in {', '.join(self.writable)}")
        import docker.errors

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
            member.mode, member.mtime = mode, now
            member.uid = member.gid = SANDBOX_UID
            if data is None:
                member.type = tarfile.DIRTYPE
                tar.addfile(member)
            else:
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
        try:
            ok = self._client.api.put_archive(self._container.id, base, buf.getvalue())
        except docker.errors.APIError as exc:
            raise _path_error(f"cannot write {full} into container {self.info.sandbox_id}", exc) from None
        if not ok:
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
        except docker.errors.APIError as exc:
            raise _path_error(f"cannot read {full} in container {self.info.sandbox_id}", exc) from None
        # get_archive streams a tar; read it as a stream so a huge file is never held whole.
        with tarfile.open(fileobj=_IterReader(stream), mode="r|") as tar:
            for member in tar:
                if not member.isfile():
                    raise SandboxError(f"{full} is not a regular file")
                handle = tar.extractfile(member)
                return handle.read(max_bytes if max_bytes is not None else -1) if handle else b""
        raise SandboxFileNotFound(f"{full}: no such file in the sandbox")


# What the engine says when a path's folders, as the agent left them, cannot be resolved: a file or a
# link loop where a folder goes (`evalSymlinksInScope: too many links`), a folder it cannot search.
_PATH_REFUSALS = ("not a directory", "too many links", "too many levels of symbolic links", "permission denied")


def _path_error(what: str, exc: Any) -> SandboxError:
    """A files call the engine refused: SandboxPathRefused when the container's contents are why (the
    agent's doing: the runner grades the file wrong), else SandboxError. The engine's host paths
    (its overlay folders) are left out of the message."""
    why = str(getattr(exc, "explanation", None) or exc)
    head, sep, tail = why.partition("/merged")
    if sep:  # "... in /var/lib/docker/overlay2/<id>/merged/workspace/x": the container's path follows
        why = f"{head.rsplit(' ', 1)[0]} {tail}"
    if any(s in why.lower() for s in _PATH_REFUSALS):
        return SandboxPathRefused(f"{what}: {why}")
    return SandboxError(f"{what}: {why}")


def _open_socket_to(path: str, what: str) -> None:
    """Let the container's user (another uid) reach a socket through its bound folder: the folder
    searchable (not listable, not writable), the socket connectable. It holds nothing else. The proxy's
    requests still need a rollout's key, exactly as on its TCP port, which any local user can reach; a
    site's socket serves only that rollout's site, in a folder of its own."""
    folder = os.path.dirname(path)
    try:
        os.chmod(folder, stat.S_IMODE(os.stat(folder).st_mode) | 0o011)
        if os.path.exists(path):
            os.chmod(path, stat.S_IMODE(os.stat(path).st_mode) | 0o006)
    except OSError as exc:
        raise SandboxError(f"cannot open {what}'s socket {path} to the container's user (uid {SANDBOX_UID}): "
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
