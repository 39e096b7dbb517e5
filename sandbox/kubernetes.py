"""The Kubernetes backend: one Pod per rollout, commands and files through the exec subresource.

    pod = build_pod_manifest(...)          # sandbox/k8s_manifests.py: Pod Security `restricted`, checked
    create -> shared watch until Running   # sandbox/k8s_client.py: one client, executor, watch, limits
    exec   -> pods/exec over WebSocket     # sandbox/k8s_exec.py: one frame loop, output capped in the pod
    kill_all -> every process but PID 1    # before the verifier: nothing the agent started survives
    expose_socket -> a task's tools and services the same way: the host socket registered with the
                  relay, each exec behind a forwarder on the pod's 127.0.0.1:PORT presenting its token
    attach_gui -> the execs run in a display (gui.py, written into the pod), the task's site at
                  127.0.0.1:8080 through forwarder.py -> the host's site relay (sandbox/site_relay.py)
    stop   -> graceful delete (delete_grace_s), wait for DELETED on the watch
    with_services -> a task's compose services as more containers of the pod (k8s_manifests.py), each
                  name a hostAliases entry for 127.0.0.1; execs only ever name the agent's container

The official `kubernetes` client is synchronous and imported lazily; its calls run in the backend's
own executor (never the default pool the store and the proxy use).
What the image must have: `sh`, `timeout`, `head`, `cat`, `tar` and `sleep` (coreutils or busybox),
and a user with the uid `run_as_user` is best (the pod runs as it; $HOME is set either way).
"""

from __future__ import annotations

import importlib.util
import os
import posixpath
import re
import secrets
import shlex
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from openforge.config import KubernetesSandboxConfig
from openforge.errors import ForgeError, SandboxError
from openforge.paths import forge_home
from openforge.sandbox.base import (EMPTY_GRADER_SH, GRADER_DIR, KILL_ALL_SH, ExecResult, IsolationReport,
                          container_path, SandboxBase, SandboxFileNotFound, SandboxInfo, SandboxPathRefused, TransientSandboxError)
from openforge.sandbox.gui import CHROMIUM_NAMES, SITE_PORT, SITE_URL, GuiSpec
from openforge.sandbox.k8s_client import ClusterClient
from openforge.sandbox.k8s_exec import (
    GUI_START_SCRIPT, GUI_TOOLS_MISSING, RawExec, api_error, first_member, is_not_found,
    run_exec_stream, tar_one_file, wrap_command,
)
from openforge.sandbox.compose import ComposeService
from openforge.sandbox.k8s_manifests import (
    CONTAINER_NAME, SERVICE_PREFIX, build_pod_manifest, check_pod_manifest, managed_selector, pod_labels, pod_name,
    sandbox_network_policy,
)
from openforge.sandbox.k8s_status import death_reason, pod_state, transient_failure, waiting_reason
from openforge.sandbox.limits import TaskLimits
from openforge.sandbox.site_relay import SiteRelay, acquire_relay, release_relay

FILE_OP_TIMEOUT_S = 120.0
# A compose service's name as a container name (`svc-<name>`, a DNS-1123 label) and a host alias of the pod.
SERVICE_ON_K8S = re.compile(rf"^[a-z0-9]([-a-z0-9]{{0,{61 - len(SERVICE_PREFIX)}}}[a-z0-9])?$")
DEATH_WAIT_S = 3.0  # after an exec died by SIGKILL or broke: how long the watch may take to say why
_FILE_MISSING = 44  # exit code of the read script when the path is not a regular file
_FILE_UNREADABLE = 46  # ... when it is one the pod's user cannot read
GUI_MODULE = Path(__file__).with_name("gui.py")
FORWARDER = Path(__file__).with_name("forwarder.py")
GUI_IN_POD = "/tmp/.forge-gui/gui.py"  # written at each attach: the launcher and the primitives
# Written before each exec that has host servers exposed: its source in argv, once per server, would
# make the exec's URL too long for an API server's request line.
FORWARDER_IN_POD = "/tmp/.forge-exposed/forwarder.py"


def _client_module():
    try:
        import kubernetes
    except ImportError:
        raise SandboxError("the kubernetes backend needs the `kubernetes` package: "
                           "pip install 'kubernetes>=37,<38'") from None
    return kubernetes


def load_client_configuration(k8s: KubernetesSandboxConfig):
    """The client Configuration: `kubeconfig` if set, else in-cluster when running in a pod, else
    the default kubeconfig ($KUBECONFIG or ~/.kube/config)."""
    import os

    kubernetes = _client_module()
    from kubernetes.client import Configuration

    cfg = type.__call__(Configuration)
    try:
        if not k8s.kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
            kubernetes.config.load_incluster_config(client_configuration=cfg)
        else:
            kubernetes.config.load_kube_config(config_file=k8s.kubeconfig or None, context=k8s.context or None,
                                               client_configuration=cfg, persist_config=False)
    except (kubernetes.config.ConfigException, OSError, ValueError) as exc:
        where = k8s.kubeconfig or "the default kubeconfig"
        raise SandboxError(f"cannot load Kubernetes credentials from {where}: {exc}") from None
    return cfg


def probe_cluster(config: KubernetesSandboxConfig) -> tuple[str, str]:
    """(verdict, detail) of the cluster `config` names, for `forge doctor` and the preflight: ok (in a pod's
    service account, or a kubeconfig context) or missing (no client, no context)."""
    if importlib.util.find_spec("kubernetes") is None:
        # a dependency of openforge since issue 29: missing, the install is older or broken
        return "missing", ("the kubernetes client is not installed "
                           "(pip install 'kubernetes>=37,<38', or reinstall openforge)")
    from kubernetes import config as kconfig

    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            kconfig.load_incluster_config()
            return "ok", "in-cluster service account"
        contexts, current = kconfig.list_kube_config_contexts(config_file=config.kubeconfig or None)
    except Exception as exc:  # noqa: BLE001
        return "missing", f"no kubeconfig context ({str(exc).splitlines()[0][:120]})"
    name = config.context or (current or {}).get("name", "?")
    return "ok", f"context {name} ({len(contexts)} in kubeconfig)"



class KubernetesSandbox(SandboxBase):
    """A rollout's sandbox as one Pod. `proxy_url` is how code in the pod reaches the proxy."""

    supports_gui = True  # the browser image; the task's site through the process's site relay (attach_gui)

    @classmethod
    def check_isolation(cls, config: KubernetesSandboxConfig) -> IsolationReport:
        return IsolationReport("kubernetes", f"pods in namespace {config.namespace}")

    @classmethod
    def preflight(cls, config: KubernetesSandboxConfig) -> None:
        verdict, detail = probe_cluster(config)
        if verdict != "ok":
            raise SandboxError(f"Kubernetes: {detail}; use sandbox.type = \"local\" or \"docker\", "
                               "or set sandbox.context / sandbox.kubeconfig")

    @classmethod
    def plan_manifests(cls, config: KubernetesSandboxConfig, *, proxy_port: int, gui: bool) -> list[dict[str, Any]]:
        """The pod every rollout gets, checked as the API server would, and the NetworkPolicy that keeps it in."""
        pod = build_pod_manifest(config, name=pod_name("dry-run"), run_id="dry-run", rollout_id="dry-run")
        check_pod_manifest(pod)
        return [pod, sandbox_network_policy(config, proxy_port=proxy_port, gui=gui)]

    @classmethod
    def collect_leftovers(cls, config: KubernetesSandboxConfig, *, home: Path, run_id: str | None,
                          is_live: Any, live_runs: bool, dry_run: bool) -> tuple[list[Any], list[str]]:
        """`gc_pods` deletes this data dir's pods by label; it cannot spare a live run's pods, so without a
        run it is called only when no run is live."""
        from openforge.sandbox.gc import Leftover

        if dry_run:
            return [], ["kubernetes: not listed in a dry run"]
        if run_id is None and live_runs:
            return [], ["kubernetes: skipped (a run is live; pass --run RUN to sweep one run's pods)"]
        try:
            names = gc_pods(config, run_id, home=home)
        except ForgeError as exc:
            return [], [f"kubernetes: skipped ({exc})"]
        return [Leftover("kubernetes", name, run_id or "", True) for name in names], []

    storage_enforced_as = ("the pod's ephemeral-storage request and limit: the kubelet evicts a pod that has "
                           "written past it at its next check, a write itself is not refused")

    @classmethod
    def with_services(cls, config: KubernetesSandboxConfig, services: list[dict[str, Any]]) -> KubernetesSandboxConfig:
        """Each service a container of the rollout's pod (k8s_manifests.py `_add_services`), reached by its name
        on 127.0.0.1. What one pod cannot hold is refused here, naming the services."""
        records = [ComposeService(**s) for s in services]
        if bad := [s.name for s in records if not SERVICE_ON_K8S.match(s.name)]:
            raise SandboxError(f"compose service {', '.join(bad)}: on the kubernetes backend a service's name is a "
                               "container name and a host alias of the pod: lower-case letters, digits and '-' "
                               f"(at most {63 - len(SERVICE_PREFIX)}); rename it or use sandbox.type = \"docker\"")
        return config.model_copy(update={"compose_services": [s.model_dump() for s in records]})

    @classmethod
    def with_limits(cls, config: KubernetesSandboxConfig, limits: TaskLimits) -> KubernetesSandboxConfig:
        # The task's need is both what the scheduler reserves and the cap, as Harbor's cluster backends size pods.
        update: dict[str, str] = {}
        if limits.cpus is not None:
            update["cpu_request"] = update["cpu_limit"] = f"{round(limits.cpus * 1000)}m"
        if limits.memory_mb is not None:
            update["memory_request"] = update["memory_limit"] = f"{limits.memory_mb}Mi"
        if limits.storage_mb is not None:
            update["ephemeral_storage_request"] = update["ephemeral_storage_limit"] = f"{limits.storage_mb}Mi"
        return config.model_copy(update=update)

    def __init__(self, config: KubernetesSandboxConfig, *, run_id: str, rollout_id: str,
                 proxy_socket: str | Path | None = None, site_socket: str | Path | None = None) -> None:
        # Neither socket is used: a pod on another node cannot bind a host's socket; it dials the proxy
        # at sandbox.proxy_url and the site through the site relay (attach_gui).
        self.config = config
        self.k8s = config
        self.run_id, self.rollout_id = run_id, rollout_id
        self.home = forge_home()  # the data dir: its label scopes the shared watch and `forge gc`
        self.name = pod_name(rollout_id)
        self.proxy_url = self.k8s.proxy_url.rstrip("/")
        self.start_retries = config.start_retries
        self.info = SandboxInfo(backend="kubernetes", sandbox_id=self.name, workdir=config.workdir,
                                proxy_host=urlparse(self.proxy_url).hostname or "127.0.0.1",
                                labels=pod_labels(run_id=run_id, rollout_id=rollout_id, home=self.home))
        self._cluster: ClusterClient | None = None
        self._waiter = None
        self._created = False
        self._stopped = threading.Event()
        # attach_gui: the spec, the relay and this rollout's token on it, and what the pod has running
        self._gui: GuiSpec | None = None
        self._relay: SiteRelay | None = None
        self._relay_token = self._relay_dial = ""
        self._gui_ready: GuiSpec | None = None  # the spec whose gui.py and forwarder the pod has
        self._forwarder_token = ""  # the token of the forwarder running in the pod, if any
        # expose_socket: port in the pod -> (the relay, the server's token on it, the host pods dial)
        self._exposed: dict[int, tuple[SiteRelay, str, str]] = {}

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._created:
            return
        # A retried start() makes a new pod: the old name may still be terminating.
        self._stopped.clear()
        self.name = self.info.sandbox_id = pod_name(self.rollout_id)
        manifest = build_pod_manifest(self.config, name=self.name, run_id=self.run_id,
                                      rollout_id=self.rollout_id, home=self.home)
        check_pod_manifest(manifest)
        self._cluster = ClusterClient.acquire(self.k8s, self.home, lambda: load_client_configuration(self.k8s))
        try:
            self._waiter = self._cluster.subscribe(self.name)  # before the create: no event is missed
            await self._create(manifest)
            await self._wait_running()
            await self._probe()
            if self.k8s.compose_services:  # a service that exited while the pod came up (as compose.py checks)
                state, why = pod_state(self._waiter.pod)
                if state == "failed":
                    raise SandboxError(f"pod {self.name}: a compose service ended before the agent started: {why}")
        except BaseException as exc:
            output = await self._services_output() if type(exc) in (SandboxError, TransientSandboxError) else ""
            await self.stop()
            if output:
                raise type(exc)(f"{exc}; {output}") from None
            raise

    async def _services_output(self) -> str:
        """The last lines of each compose service that ended, as sandbox/compose.py gives them ("" if none)."""
        cluster, pod = self._cluster, self._waiter.pod if self._waiter is not None else None
        if cluster is None or pod is None or pod.status is None or not self.k8s.compose_services:
            return ""
        told = []
        for c in pod.status.container_statuses or []:
            if c.name == CONTAINER_NAME or not (c.state and c.state.terminated):
                continue
            try:
                text = await cluster.call("log", cluster.core.read_namespaced_pod_log, self.name, self.k8s.namespace,
                                          container=c.name, tail_lines=5, _request_timeout=10)
            except Exception:  # the log is a courtesy: the failure itself is already said
                continue
            if text and text.strip():
                told.append(f"{c.name}'s last output: {text.strip()[-300:]}")
        return "; ".join(told)

    async def _probe(self) -> None:
        """One exec right away: learn $HOME (harness config goes there) and fail now, with the fix,
        if the image lacks what every later exec relies on."""
        script = ('for t in timeout head cat tar; do command -v $t >/dev/null || printf "%s " $t; done; echo; '
                  'echo "$HOME"')
        raw = await self._stream(["sh", "-c", script], 30.0, None, 4096)
        missing, _, home = raw.stdout.decode("utf-8", "replace").partition("\n")
        if raw.exit_code != 0 or missing.strip():
            why = f"lacks {missing.strip()}" if missing.strip() else f"cannot run sh ({_why(raw)})"
            raise SandboxError(f"image {self.k8s.image} {why}: the kubernetes backend needs sh, timeout, "
                               "head, cat and tar in the image (coreutils or busybox)")
        self.info.home = home.strip() or self.k8s.home

    async def _create(self, manifest: dict[str, Any]) -> None:
        cluster = self._cluster
        assert cluster is not None

        def create() -> None:
            cluster.core.create_namespaced_pod(self.k8s.namespace, manifest, _request_timeout=30)
            self._created = True
            if self._stopped.is_set():  # stop() ran (a cancelled start) while the create was in flight
                self._delete_sync(cluster)

        try:
            await cluster.call("create", create, create=True)
        except Exception as exc:  # ApiException (quota, RBAC, admission, invalid) or the transport's
            err = api_error(f"cannot create pod {self.name} in namespace {self.k8s.namespace}", exc)
            if self.k8s.compose_services and "PodSecurity" in str(err):
                err = SandboxError(f"{err} (a task's compose services run as their images' users, often root: "
                                   "they need a namespace whose Pod Security level is `baseline`, docs/kubernetes.md)")
            raise err from None
        if self._stopped.is_set():
            raise SandboxError(f"pod {self.name}: stopped while starting")

    async def _wait_running(self) -> None:
        """Follow the pod on the shared watch until Running; raise SandboxError on a state it will not
        leave by itself. A CreateContainerError (the kubelet retries it) is tolerated
        `create_error_retries` times, then the start fails as transient: a fresh pod is tried."""
        waiter = self._waiter
        deadline = time.monotonic() + self.k8s.start_timeout_s
        last, create_errors, seen_rv = "no status yet", 0, None
        while True:
            if waiter.error is not None and not isinstance(waiter.error, TransientSandboxError):
                raise waiter.error
            if waiter.deleted:  # evicted, preempted, or someone's gc
                raise TransientSandboxError(f"pod {self.name} was deleted while starting")
            if waiter.pod is not None and waiter.pod.metadata.resource_version != seen_rv:
                seen_rv = waiter.pod.metadata.resource_version
                state, why = pod_state(waiter.pod)
                if state == "running":
                    return
                last = why or last
                if state == "failed":
                    kind = TransientSandboxError if transient_failure(why) else SandboxError
                    raise kind(f"pod {self.name} cannot start: {why}")
                if waiting_reason(waiter.pod) == "CreateContainerError":
                    create_errors += 1
                    if create_errors > self.k8s.create_error_retries:
                        raise TransientSandboxError(f"pod {self.name} cannot start: {why} "
                                                    f"({create_errors} times)")
            if self._stopped.is_set():
                raise SandboxError(f"pod {self.name}: stopped while starting")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                # A busy cluster (no room yet, an autoscaler adding nodes): worth another try.
                raise TransientSandboxError(f"pod {self.name} not running after {self.k8s.start_timeout_s:g}s: {last}")
            await waiter.wait_change(min(remaining, 1.0))

    async def kill_all(self) -> None:
        """End every process in the pod but PID 1 (the keeper), so nothing the agent started is still
        running when the verifier runs. The pod, its files and the keeper stay."""
        raw = await self._stream(["sh", "-c", KILL_ALL_SH], 60.0, None, 64 * 1024)
        if raw.exit_code != 0:
            raise SandboxError(f"kill_all in pod {self.name}: {_why(raw)}")
        self._gui_ready, self._forwarder_token = None, ""  # the site's forwarder went too

    def agent_proxy_url(self, host_url: str) -> str:
        # sandbox.proxy_url: where pods dial the proxy (a Service); without it, the host's own URL.
        return self.k8s.proxy_url or super().agent_proxy_url(host_url)

    # -- GUI ---------------------------------------------------------------------------------------
    def attach_gui(self, spec: GuiSpec | None) -> None:
        """Run the following execs in an X display of their own with chromium on `spec.url` (sandbox/
        gui.py's launcher, written into the pod), and the task's site at 127.0.0.1:SITE_PORT; None
        detaches. The site is a unix socket on this host, which a pod on another node cannot bind,
        so it is registered with the process's site relay under a fresh token, and a forwarder in the
        pod (sandbox/forwarder.py --connect) carries each connection there with that token first.
        Detaching unregisters the token: the relay closes its connections and refuses new ones."""
        self._detach_gui()
        if spec is None:
            return
        self._gui_ready = None  # a new token (even for the same spec): the next exec prepares the pod anew
        if spec.site_socket:
            bind, self._relay_dial = self._relay_address()
            relay = acquire_relay(bind, self.k8s.site_relay_port)
            self._relay, self._relay_token = relay, relay.register(spec.site_socket)
        self._gui = spec

    def _relay_address(self, what: str = "a GUI task") -> tuple[str, str]:
        """(the address the relay listens on, the host a pod dials for it): pods dial the host they
        reach the proxy at; the relay listens there too unless `site_relay_host` says where (as
        proxy.host does for the proxy: 0.0.0.0 in a controller pod behind a Service)."""
        proxy_host = urlparse(self.proxy_url).hostname or ""
        if not proxy_host:
            raise SandboxError(f"{what} on the kubernetes backend needs sandbox.proxy_url: its host is where "
                               "pods reach the site relay")
        return self.k8s.site_relay_host or proxy_host, proxy_host

    # -- host servers (a task's tools and services) ------------------------------------------------
    def expose_socket(self, host_socket: str, host_url: str, port: int) -> str:
        """A host server (a task's MCP tools, a service's recording front) for the following execs, the
        way a GUI task's site reaches a pod: its socket registered with the process's site relay under
        a fresh token, and each exec run behind a forwarder (sandbox/forwarder.py --connect) on the
        pod's own 127.0.0.1:`port` that presents that token. `withdraw_sockets` unregisters it."""
        bind, dial = self._relay_address("a task's tools or services")
        if port in self._exposed:
            self._withdraw(port)
        relay = acquire_relay(bind, self.k8s.site_relay_port)
        self._exposed[port] = (relay, relay.register(host_socket), dial)
        return f"http://127.0.0.1:{port}{urlparse(host_url).path}"

    def withdraw_sockets(self) -> None:
        for port in list(self._exposed):
            self._withdraw(port)

    def _withdraw(self, port: int) -> None:
        relay, token, _ = self._exposed.pop(port)
        relay.unregister(token)  # the relay closes the token's open connections and refuses new ones
        release_relay(relay)

    def _detach_gui(self) -> None:
        relay, token = self._relay, self._relay_token
        self._gui, self._relay, self._relay_token = None, None, ""
        if relay is not None:
            relay.unregister(token)
            release_relay(relay)

    async def _prepare_gui(self, spec: GuiSpec) -> None:
        """Once per attach, before its first exec: gui.py into the pod's /tmp, the image checked for
        what a GUI exec runs, the forwarder of an earlier attach ended and this one's started."""
        if self._gui_ready is spec:
            return
        await self.write_file(GUI_IN_POD, GUI_MODULE.read_bytes())
        browsers = " ".join(CHROMIUM_NAMES) if spec.url else ""
        args = ["sh", "-c", GUI_START_SCRIPT, "sh", self._forwarder_token, browsers]
        if self._relay is not None:
            args += [FORWARDER.read_text(), "--connect", f"{self._relay_dial}:{self._relay.port}",
                     "--token", self._relay_token, "--port", str(SITE_PORT), "--"]
        # No exec marker and no `timeout` around it: the forwarder outlives this exec (until kill_all).
        raw = await self._stream(args, 60.0, None, 64 * 1024)
        if raw.exit_code == GUI_TOOLS_MISSING:
            raise SandboxError(f"image {self.k8s.image} {_why(raw)}: a GUI task needs python3 (with Pillow), "
                               "Xvfb, xdotool and chromium in the image (the browser image: forge sandbox "
                               "build-image --variant browser)")
        if raw.exit_code != 0:
            raise SandboxError(f"cannot start the site's forwarder in pod {self.name}: {_why(raw)[-500:]}")
        self._forwarder_token = self._relay_token
        self._gui_ready = spec

    def _gui_command(self, spec: GuiSpec, command: str | list[str], env: dict[str, str] | None,
                     ) -> tuple[list[str], dict[str, str]]:
        argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
        base = {"FORGE_GUI": GUI_IN_POD, "FORGE_PYTHON": "python3"}
        if spec.site_socket:
            base["FORGE_SITE_URL"] = SITE_URL
        return ["python3", "-I", GUI_IN_POD, *spec.launcher_args(), *argv], {**base, **(env or {})}

    async def stop(self) -> None:
        self._detach_gui()
        self.withdraw_sockets()
        self._stopped.set()
        cluster, waiter = self._cluster, self._waiter
        if cluster is None:
            return
        try:
            if self._created:
                await cluster.call("delete", self._delete_sync, cluster)
                self._created = False
                # Graceful: the pod object stays until the kubelet has killed its processes. Wait for
                # that on the watch (no extra requests), bounded: the kubelet finishes it regardless.
                deadline = time.monotonic() + self.k8s.delete_grace_s + 5
                while waiter is not None and not waiter.deleted and (left := deadline - time.monotonic()) > 0:
                    await waiter.wait_change(left)
        finally:
            if waiter is not None:
                cluster.unsubscribe(self.name, waiter)
            self._cluster = self._waiter = None
            cluster.release()

    def _delete_sync(self, cluster: ClusterClient) -> None:
        from kubernetes.client import V1DeleteOptions

        body = V1DeleteOptions(grace_period_seconds=self.k8s.delete_grace_s)
        for attempt in range(2):
            try:
                cluster.core.delete_namespaced_pod(self.name, self.k8s.namespace, _request_timeout=30, body=body)
                return
            except Exception as exc:
                if is_not_found(exc):
                    return
                if attempt == 1:
                    raise api_error(f"cannot delete pod {self.name} (`forge gc` removes it later)", exc) from None

    # -- exec ------------------------------------------------------------------------------------
    async def exec(self, command: str | list[str], *, timeout: float, env: dict[str, str] | None = None,
                   cwd: str | None = None, max_output: int | None = None, stdin: bytes | None = None,
                   ) -> ExecResult:
        limit = self.config.max_output_bytes if max_output is None else max_output
        if (spec := self._gui) is not None:
            await self._prepare_gui(spec)
            command, env = self._gui_command(spec, command, env)
        if self._exposed:  # each exposed host server's door, in front of the command
            await self.write_file(FORWARDER_IN_POD, FORWARDER.read_bytes())
        for port, (relay, token, dial) in self._exposed.items():
            inner = ["sh", "-c", command] if isinstance(command, str) else list(command)
            command = ["python3", "-I", FORWARDER_IN_POD, "--connect", f"{dial}:{relay.port}",
                       "--token", token, "--port", str(port), "--", *inner]
        argv = wrap_command(command, cwd=self._resolve(cwd or "."), env=env, timeout=timeout,
                            stdin_len=None if stdin is None else len(stdin), limit=limit)
        raw = await self._stream(argv, timeout, stdin, limit)
        return ExecResult(exit_code=raw.exit_code, stdout=raw.stdout.decode("utf-8", "replace"),
                          stderr=raw.stderr.decode("utf-8", "replace"), timed_out=raw.timed_out,
                          truncated=raw.truncated, duration_s=raw.duration_s)

    async def _stream(self, argv: list[str], timeout: float, stdin: bytes | None, limit: int | None) -> RawExec:
        cluster = self._cluster
        if cluster is None or not self._created or self._stopped.is_set():
            raise SandboxError(f"sandbox {self.name} is not started (or already stopped)")
        try:
            raw = await cluster.run_blocking("exec", lambda: run_exec_stream(
                cluster.api, pod=self.name, namespace=self.k8s.namespace, container=CONTAINER_NAME, argv=argv,
                timeout=timeout, stdin=stdin, limit=limit, stopped=self._stopped))
        except SandboxError as exc:
            if not self._stopped.is_set() and (why := await self._death()):
                raise SandboxError(f"pod {self.name} {why}; exec: {exc}") from None
            raise
        # SIGKILL and no timeout: maybe the whole container went (an OOM kill takes every process).
        if raw.exit_code == 137 and not raw.timed_out and (why := await self._death()):
            raise SandboxError(f"pod {self.name} {why}")
        return raw

    async def _death(self) -> str:
        """Why the pod stopped running, if the watch says so within DEATH_WAIT_S; "" if it runs on."""
        waiter = self._waiter
        deadline = time.monotonic() + DEATH_WAIT_S
        while waiter is not None:
            why = "was deleted" if waiter.deleted else death_reason(waiter.pod, memory_limit=self.k8s.memory_limit)
            if why or (left := deadline - time.monotonic()) <= 0:
                return why
            await waiter.wait_change(left)
        return ""

    async def _file_op(self, script: str, stdin: bytes | None, limit: int | None) -> RawExec:
        argv = wrap_command(["sh", "-c", script], cwd="/", env=None, timeout=FILE_OP_TIMEOUT_S,
                            stdin_len=None if stdin is None else len(stdin), limit=limit)
        return await self._stream(argv, FILE_OP_TIMEOUT_S, stdin, limit)

    async def grader_folder(self) -> str:
        """A folder named afresh in GRADER_DIR, an emptyDir of the pod's: the pod has one user, so what the
        agent (gone now) or an earlier grading left there is deleted first, down to the empty folder."""
        folder = f"{GRADER_DIR}/{secrets.token_hex(6)}"
        raw = await self._file_op(f"{EMPTY_GRADER_SH} && mkdir -- {folder}", None, 64 * 1024)
        if raw.exit_code != 0:
            raise SandboxError(f"cannot empty the grader's folder {GRADER_DIR} (exit {raw.exit_code}): "
                               f"{raw.stderr.decode('utf-8', 'replace').strip()[:300]}")
        return folder

    # -- files -----------------------------------------------------------------------------------
    def _resolve(self, path: str) -> str:
        return container_path(self.config.workdir, path)

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        full = self._resolve(path)
        folder, base = posixpath.split(full)
        q = shlex.quote(folder)
        # -o: do not try to chown to the archive's owner (fails for a non-root image user).
        raw = await self._file_op(f"mkdir -p -- {q} && tar -x -o -f - -C {q}", tar_one_file(base, data, mode),
                                  64 * 1024)
        if raw.exit_code != 0:
            # The pod's files refused it (a folder made read-only, a file or a link where a folder
            # goes): they are the agent's after its turn, and it writes as the same user, so this is
            # its doing (the runner grades it 0), never an infrastructure failure that drops its group.
            raise SandboxPathRefused(f"cannot write {full} in pod {self.name}: {_why(raw)}")

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        full = self._resolve(path)
        folder, base = posixpath.split(full)
        # Not a regular file (a FIFO, a socket, a folder), or one the pod's user cannot read (the agent
        # made it so): not the file, never a hang or an error that would read as infrastructure.
        q = shlex.quote(full)
        script = f"[ -f {q} ] || exit {_FILE_MISSING}\n[ -r {q} ] || exit {_FILE_UNREADABLE}\n"
        if max_bytes is None:
            script += f"tar -c -f - -C {shlex.quote(folder)} -- {shlex.quote(base)}"
        else:
            # A prefix needs no archive, and is cut in the pod rather than after the transfer.
            script += f"head -c {max_bytes} -- {shlex.quote(full)}"
        raw = await self._file_op(script, None, None)
        if raw.exit_code == _FILE_MISSING:
            raise SandboxFileNotFound(f"{path}: no such file in the sandbox (pod {self.name})")
        if raw.exit_code == _FILE_UNREADABLE:
            raise SandboxPathRefused(f"{path}: not readable by the sandbox's user (pod {self.name})")
        if raw.exit_code != 0:
            raise SandboxError(f"cannot read {full} in pod {self.name}: {_why(raw)}")
        if max_bytes is not None:
            return raw.stdout
        return first_member(raw.stdout, where=f"{full} in pod {self.name}")


def _why(raw: RawExec) -> str:
    return raw.stderr.decode("utf-8", "replace").strip() or f"exit code {raw.exit_code}"


def gc_pods(config: KubernetesSandboxConfig, run_id: str | None = None, *, home: Path | None = None) -> list[str]:
    """Delete every pod this data dir's forge made in the configured namespace (of one run if
    `run_id`); returns their names. For `forge gc` after a crashed run.

    Selects by label: `openforge.managed=1` and this data dir's `openforge.home` (default: the current
    FORGE_HOME), so neither other tools' pods nor another forge's sharing the namespace are touched.
    """
    from kubernetes.client import ApiClient, CoreV1Api, V1DeleteOptions

    k8s = config
    core = CoreV1Api(ApiClient(configuration=load_client_configuration(k8s)))
    selector = managed_selector(run_id, home=forge_home() if home is None else home)
    deleted: list[str] = []
    try:
        try:
            pods = core.list_namespaced_pod(k8s.namespace, label_selector=selector, _request_timeout=30)
        except Exception as exc:
            raise api_error(f"cannot list pods in namespace {k8s.namespace}", exc) from None
        for pod in pods.items:
            if pod.metadata.deletion_timestamp:  # already terminating: the kubelet finishes it
                continue
            try:
                core.delete_namespaced_pod(pod.metadata.name, k8s.namespace, _request_timeout=30,
                                           body=V1DeleteOptions(grace_period_seconds=k8s.delete_grace_s))
            except Exception as exc:
                if not is_not_found(exc):
                    raise api_error(f"cannot delete pod {pod.metadata.name}", exc) from None
            deleted.append(pod.metadata.name)
    finally:
        core.api_client.close()
    return deleted


def cluster_version(config: KubernetesSandboxConfig) -> str:
    """`v1.31.2 at https://...` for `forge doctor`; SandboxError saying why when the cluster is unreachable."""
    from kubernetes.client import ApiClient, VersionApi

    cfg = load_client_configuration(config)
    api = ApiClient(configuration=cfg)
    try:
        info = VersionApi(api).get_code(_request_timeout=10)
    except Exception as exc:
        raise api_error(f"Kubernetes API at {cfg.host}", exc) from None
    finally:
        api.close()
    return f"{info.git_version} at {cfg.host}"


__all__ = ["KubernetesSandbox", "gc_pods", "cluster_version", "load_client_configuration"]
