"""The double's pods: the apiserver's defaults, the scheduler and kubelet's life cycle, the runtime
(a bubblewrap container over a folder, as the pod's user, its command PID 1), the memory limit.
Execs enter its namespaces with nsenter (execs.py)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import uuid
from datetime import UTC, datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from kubernetes.utils import parse_quantity

V5 = "v5.channel.k8s.io"
NODE_NAME = "double-node-1"
IMAGE_ENV = _IMAGE_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def defaulted_pod(obj: dict[str, Any], ns: str) -> dict[str, Any]:
    """The object as stored: the server's metadata and the defaults the apiserver fills in."""
    pod = json.loads(json.dumps(obj))
    pod["apiVersion"], pod["kind"] = "v1", "Pod"
    meta = pod["metadata"]
    meta.update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=_now())
    spec = pod["spec"]
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    spec.setdefault("serviceAccountName", "default")
    spec["serviceAccount"] = spec["serviceAccountName"]
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("priority", 0)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    spec.setdefault("tolerations", []).extend([
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    ])
    for c in spec["containers"]:
        tagged = ":" in c["image"].rsplit("/", 1)[-1] and not c["image"].endswith(":latest")
        c.setdefault("imagePullPolicy", "IfNotPresent" if tagged else "Always")
        c.setdefault("terminationMessagePath", "/dev/termination-log")
        c.setdefault("terminationMessagePolicy", "File")
        c.setdefault("resources", {})
    requests = [c["resources"].get("requests") for c in spec["containers"]]
    limits = [c["resources"].get("limits") for c in spec["containers"]]
    qos = "Guaranteed" if all(limits) and requests == limits else ("Burstable" if any(requests + limits)
                                                                    else "BestEffort")
    pod["status"] = {"phase": "Pending", "qosClass": qos}
    return pod


def _tolerated(taint: dict[str, str], tolerations: list[dict[str, Any]]) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol["effect"] != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists" and (not tol.get("key") or tol["key"] == taint["key"]):
            return True
        if tol.get("key") == taint["key"] and tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def unschedulable_reason(double, spec: dict[str, Any]) -> str:  # type: ignore[no-untyped-def]
    """The scheduler's message for a one-node cluster, or '' when the pod fits."""
    selector = spec.get("nodeSelector") or {}
    if any(double.node_labels.get(k) != v for k, v in selector.items()):
        return ("0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector. preemption: "
                "0/1 nodes are available: 1 Preemption is not helpful for scheduling.")
    for taint in double.node_taints:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(taint, spec.get("tolerations", [])):
            shown = f"{taint['key']}: {taint['value']}" if taint.get("value") else taint["key"]
            return (f"0/1 nodes are available: 1 node(s) had untolerated taint {{{shown}}}. preemption: "
                    "0/1 nodes are available: 1 Preemption is not helpful for scheduling.")
    return ""


def _condition(kind: str, status: str = "True", **extra: str) -> dict[str, Any]:
    return {"type": kind, "status": status, "lastProbeTime": None, "lastTransitionTime": _now(), **extra}


def _container_status(c: dict[str, Any], state: dict[str, Any], *, ready: bool = False) -> dict[str, Any]:
    started = "running" in state
    out = {"name": c["name"], "image": c["image"], "imageID": "", "ready": ready, "restartCount": 0,
           "started": started, "state": state, "lastState": {}}
    if started or "terminated" in state:
        out["imageID"] = f"docker.io/library/{c['image']}@sha256:{'0' * 64}"
        out["containerID"] = f"containerd://{uuid.uuid4().hex}{uuid.uuid4().hex}"
    return out


@dataclass
class Runtime:
    """How the kubelet and runtime would run the pod's container: the user, the root filesystem,
    the volumes, the environment (the spec's `env` over the image's)."""

    uid: int = 0
    gid: int = 0
    groups: tuple[int, ...] = ()
    read_only: bool = False
    mounts: tuple[str, ...] = ()  # emptyDir mount paths: writable folders over a read-only root
    env: tuple[str, ...] = _IMAGE_ENV
    no_new_privs: bool = False
    drop_caps: tuple[str, ...] = ()  # securityContext.capabilities.drop, for a container that runs as root
    own_network: bool = False  # a network namespace of its own (KubeDouble(pod_network=True))
    joined_network: bool = False  # the pod's network namespace, joined (a second container of a pod_network pod)
    hosts: str = ""  # the kubelet's /etc/hosts of the pod (written when the spec has hostAliases)

    def user_argv(self) -> list[str]:
        """The runtime drops to the pod's user, its capabilities and (if asked) privilege escalation."""
        if not self.uid and not self.no_new_privs:
            return []
        argv = ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}"]
        argv += [f"--groups={','.join(map(str, self.groups))}"] if self.groups else ["--clear-groups"]
        if self.uid:
            argv += ["--inh-caps=-all", "--bounding-set=-all"]
        elif self.drop_caps:
            caps = ",".join(f"-{c.lower()}" for c in self.drop_caps)
            argv += [f"--inh-caps={caps}", f"--bounding-set={caps}"]
        if self.no_new_privs:
            argv.append("--no-new-privs")
        return argv + ["--"]


def container_runtime(spec: dict[str, Any], image_env: tuple[str, ...] = _IMAGE_ENV, index: int = 0) -> Runtime:
    c = spec["containers"][index]
    psc, csc = spec.get("securityContext") or {}, c.get("securityContext") or {}
    uid = csc.get("runAsUser", psc.get("runAsUser", 0))  # the double's images have no USER: root
    gid = csc.get("runAsGroup", psc.get("runAsGroup", 0))
    groups = tuple(g for g in [psc.get("fsGroup"), *(psc.get("supplementalGroups") or [])] if g is not None)
    env = dict(e.split("=", 1) for e in image_env)
    env.update({e["name"]: e.get("value", "") for e in c.get("env") or []})
    empty = {v["name"] for v in spec.get("volumes") or [] if "emptyDir" in v}
    mounts = tuple(m["mountPath"] for m in c.get("volumeMounts") or [] if m["name"] in empty)
    return Runtime(uid=uid, gid=gid, groups=groups, read_only=bool(csc.get("readOnlyRootFilesystem")),
                   mounts=mounts, env=tuple(f"{k}={v}" for k, v in env.items()),
                   no_new_privs=csc.get("allowPrivilegeEscalation") is False,
                   drop_caps=tuple((csc.get("capabilities") or {}).get("drop") or ()))


def bwrap_argv(root: Path, workdir: str, tail: list[str], ro_binds: tuple[str, ...] = (),
               runtime: Runtime | None = None) -> list[str]:
    """A container over `root`: the host's /usr and /etc (and `ro_binds`) read-only, `root` at / (read-only
    with `readOnlyRootFilesystem`, its emptyDirs writable over it), its own PID namespace in which
    the container's command is PID 1, as under a real runtime."""
    rt = runtime or Runtime()
    # The mount points live in the pod's folder (the container's /), made once, like an image's.
    for path in {workdir, *rt.mounts, *ro_binds, "/tmp", "/usr", "/etc", "/dev", "/proc"}:
        (root / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
    for path in rt.mounts:
        os.chmod(root / path.lstrip("/"), 0o777)  # an emptyDir is world-writable, as the kubelet makes it
    cmd = ["bwrap", "--ro-bind" if rt.read_only else "--bind", str(root), "/",
           "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    if rt.hosts:
        cmd += ["--ro-bind", rt.hosts, "/etc/hosts"]
    for top in ("bin", "sbin", "lib", "lib64", "lib32"):
        host, inside = Path("/") / top, root / top
        if host.is_symlink():
            if not inside.is_symlink():
                inside.symlink_to(os.readlink(host))
        elif host.is_dir():
            inside.mkdir(exist_ok=True)
            cmd += ["--ro-bind", str(host), f"/{top}"]
    cmd += ["--dev", "/dev", "--proc", "/proc"]
    if "/tmp" not in rt.mounts:
        cmd += ["--tmpfs", "/tmp"]
    for path in rt.mounts:
        cmd += ["--bind", str(root / path.lstrip("/")), path]
    # After /tmp, so a venv that lives under /tmp (a CI checkout there) is not hidden by it.
    for path in ro_binds:  # e.g. a venv, so a test can run a real harness in a pod
        cmd += ["--ro-bind", path, path]
    cmd += ["--unshare-pid", "--as-pid-1", "--die-with-parent", "--chdir", workdir]
    if rt.own_network:
        cmd.insert(-2, "--unshare-net")
    return cmd + tail


async def start_container(pod, workdir: str, argv: list[str], ro_binds: tuple[str, ...] = (),  # type: ignore[no-untyped-def]
                          runtime: Runtime | None = None, net_of: int = 0,
                          log: Path | None = None) -> asyncio.subprocess.Process:
    """The container's main process, PID 1 of new mount and PID namespaces; `pod.ns_pid` is its host
    pid, where execs join. `net_of`: the pid whose network namespace it joins (the pod's first container's,
    as every container of a pod shares one). `log`: where its stdout and stderr go (the container's log)."""
    rt = runtime or Runtime()
    pod.runtime = rt
    pod.root.mkdir(parents=True, exist_ok=True)
    read_end, write_end = os.pipe()
    out = open(log, "ab") if log is not None else asyncio.subprocess.DEVNULL  # noqa: SIM115 - the child holds it
    try:
        proc = await asyncio.create_subprocess_exec(
            *(["nsenter", "-t", str(net_of), "-n", "--"] if net_of else []),
            *bwrap_argv(pod.root, workdir, ["--info-fd", str(write_end), "--", *rt.user_argv(), "env", "-i",
                                            *rt.env, f"HOSTNAME={pod.name}", *argv], ro_binds, rt),
            stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True, pass_fds=(write_end,))
    finally:
        os.close(write_end)
        if log is not None:
            out.close()
    pod.procs.add(proc)
    pod.main = proc
    info = json.loads(await asyncio.to_thread(_read_all, read_end))
    pod.ns_pid = info["child-pid"]  # with --as-pid-1 the command itself, once bwrap has exec'd it
    bwrap = os.path.realpath(shutil.which("bwrap") or "bwrap")
    for _ in range(500):  # before the exec its mounts are not all in place: an exec could not start
        try:
            if os.readlink(f"/proc/{pod.ns_pid}/exe") != bwrap:
                return proc
        except OSError:
            return proc  # it ended already: the life cycle reports how
        await asyncio.sleep(0.01)
    raise RuntimeError("the container's process did not start")


def _read_all(fd: int) -> bytes:
    with os.fdopen(fd, "rb") as f:
        return f.read()


async def spawn_exec(pod, argv: list[str], *, stdin: bool) -> asyncio.subprocess.Process:  # type: ignore[no-untyped-def]
    """An exec joins the container's PID and mount namespaces as its user, as `runc exec` does: it
    sees the pod's files and processes, its orphans live on under PID 1, and all die with the pod."""
    rt = getattr(pod, "runtime", None) or Runtime()
    proc = await asyncio.create_subprocess_exec(
        "nsenter", "-t", str(pod.ns_pid), "-p", "-m", "-r", "-w",
        *(["-n"] if rt.own_network or rt.joined_network else []), "--",
        *rt.user_argv(), "env", "-i", *rt.env,
        f"HOSTNAME={pod.name}", *argv,
        stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
    pod.procs.add(proc)
    return proc


async def kill_processes(pod) -> None:  # type: ignore[no-untyped-def]
    """Everything in the pod dies: PID 1 first (the kernel then kills its whole PID namespace, and
    bwrap, its parent, reaps it), then every process the double started for it."""
    for c in [pod, *getattr(pod, "sidecars", {}).values()]:
        if c.ns_pid and c.main is not None and c.main.returncode is None:
            try:
                os.kill(c.ns_pid, signal.SIGKILL)
                await asyncio.wait_for(c.main.wait(), 5)
            except (ProcessLookupError, TimeoutError):
                pass
    for proc in list(pod.procs):
        if proc.returncode is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for proc in list(pod.procs):
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except TimeoutError:
            pass
    pod.procs.clear()


def _pid_ns(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return ""


def pod_rss(pod) -> int:  # type: ignore[no-untyped-def]
    """Resident memory of every process in the pod's PID namespace (the cgroup's usage, roughly)."""
    ns, total = _pid_ns(pod.ns_pid), 0
    if not ns:
        return 0
    for proc in psutil.process_iter():
        try:
            if _pid_ns(proc.pid) == ns:
                total += proc.memory_info().rss
        except (psutil.Error, OSError):
            continue
    return total


async def oom_watch(pod, limit: int, main: asyncio.subprocess.Process) -> None:  # type: ignore[no-untyped-def]
    """cgroup v2 with memory.oom.group, as the kubelet sets it: past the limit the kernel kills every
    process of the container at once, and the container ends OOMKilled (137)."""
    while main.returncode is None:
        if pod_rss(pod) > limit:
            pod.oom_killed = True
            await kill_processes(pod)
            return
        await asyncio.sleep(0.05)


async def run_pod_lifecycle(double, pod) -> None:  # type: ignore[no-untyped-def]
    """Scheduler + kubelet for one pod, one status change per step so watches see each phase."""
    spec, status = pod.obj["spec"], pod.obj["status"]
    container = spec["containers"][0]
    await asyncio.sleep(double.step_s)
    if why := unschedulable_reason(double, spec):
        status["conditions"] = [_condition("PodScheduled", "False", reason="Unschedulable", message=why)]
        double._bump(pod, "MODIFIED")
        return  # stays Pending until deleted, as on a cluster with no node that fits
    spec["nodeName"] = NODE_NAME
    status.update(hostIP="10.0.0.1", hostIPs=[{"ip": "10.0.0.1"}], startTime=_now(), conditions=[
        _condition("PodReadyToStartContainers", "False"), _condition("Initialized"),
        _condition("Ready", "False", reason="ContainersNotReady", message=f"containers with unready status: "
                                                                           f"[{container['name']}]"),
        _condition("ContainersReady", "False", reason="ContainersNotReady"), _condition("PodScheduled")])
    status["containerStatuses"] = [_container_status(container, {"waiting": {"reason": "ContainerCreating"}})]
    double._bump(pod, "MODIFIED")
    containers = spec["containers"]
    if len(containers) > 1:
        status["containerStatuses"] = [_container_status(c, {"waiting": {"reason": "ContainerCreating"}})
                                       for c in containers]
    await asyncio.sleep(double.step_s)
    if missing := next((c for c in containers if c["image"] not in double.images), None):
        ref = f"docker.io/library/{missing['image']}"
        for reason, message in [
            ("ErrImagePull", f'failed to pull and unpack image "{ref}": failed to resolve reference "{ref}": '
                             f"{ref}: not found"),
            ("ImagePullBackOff", f'Back-off pulling image "{missing["image"]}"'),
        ]:
            status["containerStatuses"] = [
                _container_status(c, {"waiting": {"reason": reason, "message": message} if c is missing
                                      else {"reason": "ContainerCreating"}}) for c in containers]
            double._bump(pod, "MODIFIED")
            await asyncio.sleep(double.step_s)
        return
    if spec.get("hostAliases"):
        _write_hosts(pod, spec)
    proc = await _create_container(double, pod, container)
    if proc is None:
        return
    sidecars = [await _start_sidecar(double, pod, i) for i in range(1, len(containers))]
    if sidecars:
        await asyncio.sleep(double.step_s)  # the kubelet's next status sync: a container that exited at once shows
    started = _now()
    status["podIP"], status["podIPs"] = "10.244.0.7", [{"ip": "10.244.0.7"}]
    status["phase"] = "Running"
    for cond in status["conditions"]:
        cond.update(status="True", lastTransitionTime=started)
        cond.pop("reason", None), cond.pop("message", None)
    status["containerStatuses"] = [_container_status(c, {"running": {"startedAt": started}}, ready=True)
                                   for c in containers]
    double._bump(pod, "MODIFIED")
    for i, side in enumerate(sidecars, 1):  # restartPolicy Never: an ended container stays ended, the pod runs on
        side.task = asyncio.create_task(_watch_sidecar(double, pod, i, side, started))
    deadline = spec.get("activeDeadlineSeconds")
    try:
        code = await asyncio.wait_for(proc.wait(), deadline)
    except TimeoutError:
        await kill_processes(pod)
        status.update(phase="Failed", reason="DeadlineExceeded",
                      message="Pod was active on the node longer than the specified deadline")
        double._bump(pod, "MODIFIED")
        return
    exit_code = 128 - code if code < 0 else code
    reason = "Completed" if exit_code == 0 else "Error"
    if getattr(pod, "oom_killed", False):
        exit_code, reason = 137, "OOMKilled"
    status["phase"] = "Succeeded" if exit_code == 0 else "Failed"
    status["containerStatuses"][0] = _container_status(container, {"terminated": {
        "exitCode": exit_code, "reason": reason, "startedAt": started, "finishedAt": _now()}})
    double._bump(pod, "MODIFIED")


@dataclass
class Sidecar:
    """A pod's second (third, ...) container: its own root folder, mount and PID namespaces; the pod's
    network namespace. An exec naming it enters it (spawn_exec takes it in place of the pod)."""

    name: str  # the pod's name (its HOSTNAME, as the kubelet gives every container of the pod)
    root: Path
    procs: set  # the pod's: every process dies with the pod
    ns_pid: int = 0
    main: asyncio.subprocess.Process | None = None
    runtime: object = None
    task: asyncio.Task | None = None
    log: Path | None = None  # its stdout and stderr, as `GET .../log?container=` serves them


def _write_hosts(pod, spec: dict[str, Any]) -> None:  # type: ignore[no-untyped-def]
    """The kubelet's managed /etc/hosts: localhost, the pod's own name, then the spec's hostAliases."""
    lines = ["# Kubernetes-managed hosts file.", "127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback",
             f"10.244.0.7\t{pod.name}", "", "# Entries added by HostAliases."]
    lines += ["\t".join([a["ip"], *a["hostnames"]]) for a in spec["hostAliases"]]
    path = pod.root.parent / f"{pod.root.name}.hosts"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    pod.hosts = str(path)


async def _start_sidecar(double, pod, index: int) -> Sidecar:  # type: ignore[no-untyped-def]
    c = pod.obj["spec"]["containers"][index]
    runtime = container_runtime(pod.obj["spec"], double.image_env, index)
    runtime.hosts, runtime.joined_network = getattr(pod, "hosts", ""), double.pod_network
    side = Sidecar(name=pod.name, root=pod.root.parent / f"{pod.root.name}.{c['name']}", procs=pod.procs)
    pod.sidecars[c["name"]] = side
    argv = list(c.get("command") or []) + list(c.get("args") or [])
    side.log = pod.root.parent / f"{pod.root.name}.{c['name']}.log"
    await start_container(side, c.get("workingDir") or "/", argv or ["sleep", "3600"], double.ro_binds, runtime,
                          net_of=pod.ns_pid if double.pod_network else 0, log=side.log)
    return side


async def _watch_sidecar(double, pod, index: int, side: Sidecar, started: str) -> None:  # type: ignore[no-untyped-def]
    assert side.main is not None
    code = await side.main.wait()
    status = pod.obj["status"]
    if status.get("phase") != "Running":
        return
    exit_code = 128 - code if code < 0 else code
    status["containerStatuses"][index] = _container_status(pod.obj["spec"]["containers"][index], {"terminated": {
        "exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error", "startedAt": started,
        "finishedAt": _now()}})
    double._bump(pod, "MODIFIED")


async def _create_container(double, pod, container: dict[str, Any]):  # type: ignore[no-untyped-def]
    """The runtime's part: refuse what the kubelet refuses, hiccup if asked, start PID 1."""
    spec = pod.obj["spec"]
    runtime = container_runtime(spec, double.image_env)
    runtime.own_network = double.pod_network
    runtime.hosts = getattr(pod, "hosts", "")
    csc, psc = container.get("securityContext") or {}, spec.get("securityContext") or {}
    if csc.get("runAsNonRoot", psc.get("runAsNonRoot")) and not runtime.uid:
        await _waiting(double, pod, container, "CreateContainerConfigError",
                       f"container has runAsNonRoot and image will run as root (pod: \"{pod.name}_{pod.ns}"
                       f'({pod.obj["metadata"]["uid"]})", container: {container["name"]})')
        return None  # the kubelet keeps retrying; nothing changes until someone fixes the spec
    for _ in range(double.create_container_errors):  # the runtime hiccups, the kubelet retries
        await _waiting(double, pod, container, "CreateContainerError",
                       f'failed to reserve container name "{container["name"]}_{pod.name}": name is reserved')
    argv = list(container.get("command") or []) + list(container.get("args") or [])
    proc = await start_container(pod, container.get("workingDir") or "/", argv or ["sleep", "3600"],
                                 double.ro_binds, runtime)
    if double.pod_network:
        from .network import pod_network_up

        await pod_network_up(pod, double.node_ports)
    memory = (container.get("resources") or {}).get("limits", {}).get("memory")
    if double.enforce_memory and memory:
        asyncio.create_task(oom_watch(pod, int(parse_quantity(memory)), proc))
    return proc


async def _waiting(double, pod, container: dict[str, Any], reason: str, message: str) -> None:  # type: ignore[no-untyped-def]
    pod.obj["status"]["containerStatuses"] = [_container_status(container, {"waiting": {"reason": reason,
                                                                                         "message": message}})]
    double._bump(pod, "MODIFIED")
    await asyncio.sleep(double.step_s)
