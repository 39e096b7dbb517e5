"""A Kubernetes API double on loopback: enough of the real protocol for the unchanged client to work.

No API server can run on this machine, so the Kubernetes backend is tested against this. It speaks
what `kubernetes` (the official Python client) sends and expects, checked against the client's code
(stream/ws_client.py, watch/watch.py) and the apiserver's (wsstream, remotecommand):

- `/version`: a complete version.Info (the client's model refuses a partial one);
- pods in a namespace: create (201, with the apiserver's defaults filled in), get, list with
  labelSelector / fieldSelector, delete (grace 0 removes at once), `?watch=true` as newline-delimited
  JSON events `{"type", "object"}` (ADDED for the current state when no resourceVersion is given,
  then MODIFIED/DELETED), `timeoutSeconds`; errors as `metav1.Status` JSON with the real reasons
  (NotFound, AlreadyExists, Invalid, Forbidden quota, Unauthorized);
- `pods/{name}/exec` over WebSocket with `v5.channel.k8s.io` / `v4.channel.k8s.io`: one channel byte
  before each binary frame (0 stdin, 1 stdout, 2 stderr, 3 status, 4 resize; v5 adds the CLOSE
  signal `[255, channel]`), an empty stdout frame first (the kubelet's "ready" signal), and the
  exit status on channel 3 as metav1.Status (`Success`, or `NonZeroExitCode` with an `ExitCode` cause);
- a pod's life: Pending -> scheduled (or Unschedulable: node selector / untolerated taint) ->
  ContainerCreating -> Running (or ErrImagePull -> ImagePullBackOff for an unknown image) ->
  Succeeded/Failed when the container exits, Failed/DeadlineExceeded at activeDeadlineSeconds.

Admission is the apiserver's: validation (422) and Pod Security admission (403, `restricted` in the
`openforge` namespace by default; tests/k8s_double/admission.py). A pod is realised as a folder used
as its root filesystem under bubblewrap (the host's /usr and /etc read-only; the folder read-only too
with `readOnlyRootFilesystem`, its emptyDirs writable), in new mount and PID namespaces, its command
PID 1, run as the pod's user without capabilities (setpriv). An exec enters those namespaces with
nsenter as that user, as `runc exec` does: it sees the pod's files and processes, and what it leaves
running lives on under PID 1. As with a real kubelet, closing an exec stream does not kill its
process, and an exec's output stays open while a background child holds it. A graceful delete sends
TERM to PID 1 and KILLs after the grace period before the object goes; a force delete (grace 0)
removes the object first and the processes a second later. Knobs make the double misbehave as a
cluster can: `enforce_memory` (a cgroup-v2 OOM kill of the whole pod past its limit),
`create_container_errors` (CreateContainerError before each start), `throttle_creates` (429 with
Retry-After). A pod's further containers (a task's compose services) each run over a folder of their own,
in their own mount and PID namespaces but the pod's network (pods.Sidecar); an exec naming one enters it,
`GET .../log?container=` serves its output; with `hostAliases` every container gets the kubelet's
/etc/hosts listing them. `pod_network` gives each pod a network namespace of its own that reaches the host only
at the node's address and `node_ports` (network.py); by default pods share the host's network.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from kubernetes.client import V1Pod

from .admission import admit_pod, pod_security_violations
from .protocol import _error, _now, parse_selector, selector_matches, status_json
from .execs import run_exec
from .pods import IMAGE_ENV, NODE_NAME, V5, defaulted_pod, kill_processes, run_pod_lifecycle

V4 = "v4.channel.k8s.io"


def bwrap_available() -> bool:
    if not (shutil.which("bwrap") and shutil.which("nsenter")):
        return False
    probe = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--unshare-pid", "true"], capture_output=True)
    return probe.returncode == 0 and os.geteuid() == 0  # nsenter into another PID namespace needs root


@dataclass
class _Pod:
    obj: dict[str, Any]
    root: Path
    procs: set[asyncio.subprocess.Process] = field(default_factory=set)  # every process it runs
    task: asyncio.Task | None = None
    ns_pid: int = 0  # host pid of the container's main process (its PID 1): execs enter its namespaces
    main: asyncio.subprocess.Process | None = None  # the runtime's process for the container
    runtime: object = None  # pods.Runtime: user, read-only root, volumes, env
    oom_killed: bool = False
    servers: list = field(default_factory=list)  # network.py: the node-port listeners in its namespace
    carried: set = field(default_factory=set)  # network.py: their connection handlers (tasks)
    carried_writers: set = field(default_factory=set)  # and both ends of each carried connection
    sidecars: dict = field(default_factory=dict)  # pods.Sidecar by name: the spec's containers after the first
    hosts: str = ""  # the kubelet's /etc/hosts for it, when its spec has hostAliases

    @property
    def ns(self) -> str:
        return self.obj["metadata"]["namespace"]

    @property
    def name(self) -> str:
        return self.obj["metadata"]["name"]


class KubeDouble:
    """Run with `start()` (a background thread with its own event loop); `url` is the API server."""

    def __init__(self, root: Path, *, token: str = "double-token", images: set[str] | None = None,
                 namespaces: set[str] | None = None, node_labels: dict[str, str] | None = None,
                 node_taints: list[dict[str, str]] | None = None, protocols: tuple[str, ...] = (V5, V4),
                 max_pods: int | None = None, step_s: float = 0.02, ro_binds: tuple[str, ...] = (),
                 pod_security: dict[str, str] | None = None, enforce_memory: bool = False,
                 create_container_errors: int = 0, throttle_creates: int = 0,
                 image_env: tuple[str, ...] = IMAGE_ENV, pod_network: bool = False,
                 node_ports: tuple[int, ...] = ()) -> None:
        self.root = root
        self.token = token
        self.images = images if images is not None else {"openforge:test"}
        self.namespaces = namespaces or {"default", "openforge"}
        self.node_labels = {"kubernetes.io/hostname": NODE_NAME, "kubernetes.io/os": "linux",
                            **(node_labels or {})}
        self.node_taints = node_taints or []
        self.protocols = protocols
        self.max_pods = max_pods
        self.ro_binds = ro_binds  # host folders every pod sees read-only at the same path (a venv)
        self.image_env = image_env  # the image's ENV (PATH: put a shared venv's bin first)
        self.step_s = step_s  # time between lifecycle steps: long enough that a watch sees each one
        # The namespace label pod-security.kubernetes.io/enforce: openforge is `restricted`, as it
        # should be on a cluster; default is unlabelled (privileged), for hand-made test pods.
        self.pod_security = {"openforge": "restricted"} if pod_security is None else pod_security
        self.enforce_memory = enforce_memory  # kill a pod past its memory limit, as cgroup v2 does
        self.create_container_errors = create_container_errors  # CreateContainerError seen before each start
        self.throttle_creates = throttle_creates  # the next N creates are answered 429 with Retry-After
        # Each pod in a network namespace of its own, reaching the host only at network.NODE_IP:node_ports
        # (default: pods share the host's network, and reach its loopback).
        self.pod_network = pod_network
        self.node_ports = node_ports
        self.watch_timeout_s = 1800.0  # the server ends every watch after this long
        self.compacted_rv = 0  # a watch from a resourceVersion below this gets 410 Gone
        self.pods: dict[tuple[str, str], _Pod] = {}
        self.events: list[tuple[int, str, dict[str, Any]]] = []
        self.watchers: list[tuple[str, list, list, asyncio.Queue]] = []
        self.exec_protocols: list[str] = []  # subprotocol negotiated by each exec, for assertions
        self.requests: list[tuple[str, str, dict[str, str]]] = []  # (method, path, query) of each request
        self._rv = 100
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    # -- server ----------------------------------------------------------------------------------
    def start(self) -> str:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True, name="kube-double")
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("kube double did not start")
        return self.url

    def _serve(self, ready: threading.Event) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)

        async def boot() -> None:
            app = web.Application(middlewares=[self._auth])
            base = "/api/v1/namespaces/{ns}/pods"
            app.router.add_get("/version", self._version)
            app.router.add_get("/version/", self._version)  # the client asks with the slash
            app.router.add_post(base, self._create)
            app.router.add_get(base, self._list)
            app.router.add_get(base + "/{name}", self._get)
            app.router.add_delete(base + "/{name}", self._delete)
            app.router.add_route("*", base + "/{name}/exec", self._exec)
            app.router.add_get(base + "/{name}/log", self._log)
            self._runner = web.AppRunner(app, handle_signals=False)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0, shutdown_timeout=0.5)  # open watches end at stop
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.url = f"http://127.0.0.1:{port}"
            ready.set()

        self._loop.run_until_complete(boot())
        self._loop.run_forever()

    def stop(self) -> None:
        if not self._loop:
            return

        async def shutdown() -> None:
            for pod in list(self.pods.values()):
                await self._remove(pod, emit=False)
            if self._runner:
                await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(15)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def call(self, fn, *args):  # type: ignore[no-untyped-def]
        """Run `fn(*args)` (sync or coroutine) in the server's loop, from a test."""
        async def run():  # type: ignore[no-untyped-def]
            out = fn(*args)
            return await out if asyncio.iscoroutine(out) else out

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)  # type: ignore[arg-type]

    def write_kubeconfig(self, path: Path, *, namespace: str = "openforge") -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "double", "preferences": {},
            "clusters": [{"name": "double", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": self.token}}],
            "contexts": [{"name": "double", "context": {"cluster": "double", "user": "tester",
                                                          "namespace": namespace}}],
        }))
        return path

    @web.middleware
    async def _auth(self, request: web.Request, handler):  # type: ignore[no-untyped-def]
        self.requests.append((request.method, request.path, dict(request.query)))
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return _error(401, "Unauthorized", "Unauthorized")
        return await handler(request)

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({
            "major": "1", "minor": "31", "emulationMajor": "1", "emulationMinor": "31",
            "minCompatibilityMajor": "1", "minCompatibilityMinor": "30", "gitVersion": "v1.31.4",
            "gitCommit": "a78aa47129b8539636eb86a9d00e31b2720fe06b", "gitTreeState": "clean",
            "buildDate": "2024-12-10T11:38:08Z", "goVersion": "go1.22.9", "compiler": "gc",
            "platform": "linux/amd64",
        })

    # -- state -----------------------------------------------------------------------------------
    def _bump(self, pod: _Pod, etype: str) -> None:
        self._rv += 1
        pod.obj["metadata"]["resourceVersion"] = str(self._rv)
        snapshot = json.loads(json.dumps(pod.obj))
        V1Pod.model_validate(snapshot)  # the double must not invent fields: the client's model refuses extras
        self.events.append((self._rv, etype, snapshot))
        for ns, labels, fields, queue in self.watchers:
            if self._matches(snapshot, ns, labels, fields):
                queue.put_nowait((etype, snapshot))

    @staticmethod
    def _matches(obj: dict, ns: str, labels: list, fields: list) -> bool:
        meta = obj["metadata"]
        field_values = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"],
                        "status.phase": obj.get("status", {}).get("phase", ""),
                        "spec.nodeName": obj["spec"].get("nodeName", "")}
        return meta["namespace"] == ns and selector_matches(labels, meta.get("labels", {})) \
            and selector_matches(fields, field_values)

    def _check_ns(self, ns: str) -> web.Response | None:
        if ns not in self.namespaces:
            return _error(404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"})
        return None

    def compact(self) -> None:
        """Forget the event history, as etcd compaction does: older resourceVersions are gone (410)."""
        self.compacted_rv = self._rv + 1
        self.events.clear()

    # -- REST ------------------------------------------------------------------------------------
    async def _create(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        if (bad := self._check_ns(ns)) is not None:
            return bad
        try:
            obj = await request.json()
        except ValueError:
            return _error(400, "BadRequest", "the body of the request was in an unknown format")
        meta = obj.setdefault("metadata", {})
        if meta.get("namespace", ns) != ns:
            return _error(400, "BadRequest", "the namespace of the provided object does not match the "
                                             "namespace sent on the request")
        if problems := admit_pod(obj):
            name = meta.get("name", "")
            return _error(422, "Invalid", f'Pod "{name}" is invalid: ' + ", ".join(problems),
                          {"name": name, "kind": "Pod",
                           "causes": [{"reason": "FieldValueInvalid", "message": p} for p in problems]})
        name = meta["name"]
        if self.throttle_creates > 0:
            self.throttle_creates -= 1
            resp = _error(429, "TooManyRequests", "the server has received too many requests and has asked us "
                                                  "to try again later", {"retryAfterSeconds": 1})
            resp.headers["Retry-After"] = "1"
            return resp
        level = self.pod_security.get(ns, "privileged")
        if violations := pod_security_violations(obj, level):
            return _error(403, "Forbidden", f'pods "{name}" is forbidden: violates PodSecurity "{level}:latest": '
                          + ", ".join(violations), {"name": name, "kind": "pods"})
        if (ns, name) in self.pods:
            return _error(409, "AlreadyExists", f'pods "{name}" already exists', {"name": name, "kind": "pods"})
        in_ns = sum(1 for key in self.pods if key[0] == ns)
        if self.max_pods is not None and in_ns >= self.max_pods:
            return _error(403, "Forbidden", f'pods "{name}" is forbidden: exceeded quota: pod-quota, requested: '
                                            f"pods=1, used: pods={in_ns}, limited: pods={self.max_pods}",
                          {"name": name, "kind": "pods"})
        pod = _Pod(obj=defaulted_pod(obj, ns), root=self.root / ns / name)
        self.pods[(ns, name)] = pod
        self._bump(pod, "ADDED")
        pod.task = asyncio.create_task(run_pod_lifecycle(self, pod))
        return web.json_response(pod.obj, status=201)

    async def _get(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        pod = self.pods.get((ns, name))
        if pod is None:
            return _error(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})
        return web.json_response(pod.obj)

    async def _log(self, request: web.Request) -> web.Response:
        """A container's log as plain text (`tailLines`): kept for the pod's further containers only."""
        ns, name = request.match_info["ns"], request.match_info["name"]
        pod = self.pods.get((ns, name))
        if pod is None:
            return _error(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})
        container = request.query.get("container", "")
        side = pod.sidecars.get(container)
        if side is None or side.log is None:
            return _error(400, "BadRequest", f'container "{container}" in pod "{name}" is waiting to start: '
                                             "ContainerCreating")
        lines = side.log.read_text(errors="replace").splitlines(keepends=True)
        tail = int(request.query.get("tailLines", "0") or 0)
        return web.Response(text="".join(lines[-tail:] if tail else lines), content_type="text/plain")

    async def _list(self, request: web.Request) -> web.StreamResponse:
        ns = request.match_info["ns"]
        if (bad := self._check_ns(ns)) is not None:
            return bad
        labels = parse_selector(request.query.get("labelSelector", ""))
        fields = parse_selector(request.query.get("fieldSelector", ""))
        if request.query.get("watch") in ("true", "1"):
            return await self._watch(request, ns, labels, fields)
        items = []
        for pod in self.pods.values():
            if self._matches(pod.obj, ns, labels, fields):
                item = json.loads(json.dumps(pod.obj))
                item.pop("kind"), item.pop("apiVersion")  # list items carry neither, as from the apiserver
                items.append(item)
        return web.json_response({"kind": "PodList", "apiVersion": "v1",
                                  "metadata": {"resourceVersion": str(self._rv)}, "items": items})

    async def _watch(self, request: web.Request, ns: str, labels: list, fields: list) -> web.StreamResponse:
        queue: asyncio.Queue = asyncio.Queue()
        since = request.query.get("resourceVersion", "")
        if since in ("", "0"):
            for pod in self.pods.values():
                if self._matches(pod.obj, ns, labels, fields):
                    queue.put_nowait(("ADDED", json.loads(json.dumps(pod.obj))))
        elif int(since) < self.compacted_rv:  # etcd compacted past it: the client must list again
            queue.put_nowait(("ERROR", status_json(410, "Expired", f"too old resource version: {since} "
                                                                   f"({self.compacted_rv})")))
        else:
            for rv, etype, obj in self.events:
                if rv > int(since) and self._matches(obj, ns, labels, fields):
                    queue.put_nowait((etype, obj))
        entry = (ns, labels, fields, queue)
        self.watchers.append(entry)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        # The apiserver ends a watch when it likes (--min-request-timeout, a restart): clients resume.
        window = min(float(request.query.get("timeoutSeconds", "1800")), self.watch_timeout_s)
        deadline = asyncio.get_running_loop().time() + window
        try:
            while (left := deadline - asyncio.get_running_loop().time()) > 0:
                try:
                    etype, obj = await asyncio.wait_for(queue.get(), left)
                except TimeoutError:
                    break
                await resp.write(json.dumps({"type": etype, "object": obj}).encode() + b"\n")
                if etype == "ERROR":
                    break
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.watchers.remove(entry)
        return resp

    async def _delete(self, request: web.Request) -> web.Response:
        """A graceful delete marks the pod (deletionTimestamp) and returns at once; the kubelet sends
        TERM to PID 1, KILLs what is left after the grace period, and only then the object goes
        (DELETED). Grace 0 is a force delete: the object goes at once, and the processes die a moment
        later, when the kubelet notices: they outlive the delete call, as on a real node."""
        ns, name = request.match_info["ns"], request.match_info["name"]
        pod = self.pods.get((ns, name))
        if pod is None:
            return _error(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})
        body = await request.read()
        grace = json.loads(body).get("gracePeriodSeconds") if body else None
        if grace is None:
            grace = request.query.get("gracePeriodSeconds")
        grace = int(pod.obj["spec"].get("terminationGracePeriodSeconds", 30) if grace is None else grace)
        meta = pod.obj["metadata"]
        if "deletionTimestamp" in meta and grace > 0:
            return web.json_response(pod.obj)  # already terminating
        meta["deletionTimestamp"], meta["deletionGracePeriodSeconds"] = _now(), grace
        if grace == 0:
            self.pods.pop((ns, name), None)
            self._bump(pod, "DELETED")
            asyncio.get_running_loop().call_later(1.0, lambda: asyncio.ensure_future(self._remove(pod, emit=False)))
            return web.json_response(pod.obj)
        self._bump(pod, "MODIFIED")
        asyncio.ensure_future(self._terminate(pod, grace))
        return web.json_response(pod.obj)

    async def _terminate(self, pod: _Pod, grace: int) -> None:
        main = pod.main
        if main is not None and main.returncode is None:
            try:
                os.kill(pod.ns_pid, signal.SIGTERM)  # PID 1 gets it only if it handles TERM, as in a container
                for side in pod.sidecars.values():
                    if side.ns_pid:
                        os.kill(side.ns_pid, signal.SIGTERM)
                await asyncio.wait_for(main.wait(), grace)
            except (ProcessLookupError, TimeoutError):
                pass
        await self._remove(pod)

    async def _remove(self, pod: _Pod, emit: bool = True) -> None:
        if pod.task and not pod.task.done():
            pod.task.cancel()
        await kill_processes(pod)
        if pod.servers:
            from .network import pod_network_down

            await pod_network_down(pod)
        shutil.rmtree(pod.root, ignore_errors=True)
        for side in pod.sidecars.values():
            shutil.rmtree(side.root, ignore_errors=True)
            if side.log is not None:
                side.log.unlink(missing_ok=True)
        if pod.hosts:
            Path(pod.hosts).unlink(missing_ok=True)
        if self.pods.get((pod.ns, pod.name)) is pod:
            self.pods.pop((pod.ns, pod.name), None)
        if emit:
            self._bump(pod, "DELETED")

    # -- exec ------------------------------------------------------------------------------------
    async def _exec(self, request: web.Request) -> web.StreamResponse:
        ns, name = request.match_info["ns"], request.match_info["name"]
        pod = self.pods.get((ns, name))
        if pod is None:
            return _error(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})
        container = request.query.get("container") or pod.obj["spec"]["containers"][0]["name"]
        names = [c["name"] for c in pod.obj["spec"]["containers"]]
        if container not in names:
            return _error(400, "BadRequest", f"container {container} is not valid for pod {name}")
        phase = pod.obj["status"]["phase"]
        if phase in ("Succeeded", "Failed"):
            return _error(400, "BadRequest",
                          f"cannot exec into a container in a completed pod; current phase is {phase}")
        if phase != "Running" or (container != names[0] and container not in pod.sidecars):
            return _error(400, "BadRequest", f'pod {name} does not have a host assigned'
                          if not pod.obj["spec"].get("nodeName") else f'container "{container}" in pod '
                          f'"{name}" is waiting to start: ContainerCreating')
        command = request.query.getall("command", [])
        if not command:
            return _error(400, "BadRequest", "you must specify at least 1 command")
        ws = web.WebSocketResponse(protocols=self.protocols, compress=False, max_msg_size=0)
        await ws.prepare(request)
        self.exec_protocols.append(ws.ws_protocol or "")
        target = pod if container == names[0] else pod.sidecars[container]
        await run_exec(self, target, ws, command, stdin=request.query.get("stdin") in ("true", "1"),
                       protocol=ws.ws_protocol or V4)
        return ws
