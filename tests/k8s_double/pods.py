"""The double's pods: admission and defaults as the apiserver applies them, the kubelet's life
cycle, and exec over the channel protocol. A pod's container is a bubblewrap sandbox over a folder;
execs enter its namespaces with nsenter."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web

V5 = "v5.channel.k8s.io"
NODE_NAME = "double-node-1"
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def admit_pod(obj: dict[str, Any]) -> list[str]:
    """The validation errors the apiserver would return (422), in its wording; [] = admitted."""
    problems = []
    name = obj.get("metadata", {}).get("name", "")
    if not name:
        problems.append("metadata.name: Required value: name or generateName is required")
    elif len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
        problems.append(f'metadata.name: Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist '
                        "of lower case alphanumeric characters, '-' or '.'")
    spec = obj.get("spec") or {}
    containers = spec.get("containers") or []
    if not containers:
        problems.append("spec.containers: Required value")
    for i, c in enumerate(containers):
        if not c.get("name"):
            problems.append(f"spec.containers[{i}].name: Required value")
        if not c.get("image"):
            problems.append(f"spec.containers[{i}].image: Required value")
    if spec.get("restartPolicy", "Always") not in ("Always", "OnFailure", "Never"):
        problems.append(f'spec.restartPolicy: Unsupported value: "{spec["restartPolicy"]}"')
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and (not isinstance(deadline, int) or deadline <= 0):
        problems.append(f"spec.activeDeadlineSeconds: Invalid value: {deadline}: must be greater than 0")
    return problems


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


def bwrap_argv(root: Path, workdir: str, tail: list[str], ro_binds: tuple[str, ...] = ()) -> list[str]:
    """A container over `root`: the host's /usr and /etc (and `ro_binds`) read-only, `root` writable at
    /, own PID ns."""
    cmd = ["bwrap", "--bind", str(root), "/", "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for top in ("bin", "sbin", "lib", "lib64", "lib32"):
        host, inside = Path("/") / top, root / top
        # The skeleton lives in the pod's folder (it is the container's /), made once, like an image's.
        if host.is_symlink():
            if not inside.is_symlink():
                inside.symlink_to(os.readlink(host))
        elif host.is_dir():
            cmd += ["--ro-bind", str(host), f"/{top}"]
    cmd += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    # After the /tmp tmpfs, so a venv that lives under /tmp (a CI checkout there) is not hidden by it.
    for path in ro_binds:  # e.g. a venv, so a test can run a real harness in a pod
        cmd += ["--ro-bind", path, path]
    cmd += ["--unshare-pid", "--die-with-parent", "--dir", workdir, "--chdir", workdir]
    return cmd + tail


_CONTAINER_ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"]


async def start_container(pod, workdir: str, argv: list[str], ro_binds: tuple[str, ...] = (),
                          ) -> asyncio.subprocess.Process:  # type: ignore[no-untyped-def]
    """The container's main process in new mount and PID namespaces; `pod.ns_pid` is where execs join."""
    pod.root.mkdir(parents=True, exist_ok=True)
    read_end, write_end = os.pipe()
    try:
        proc = await asyncio.create_subprocess_exec(
            *bwrap_argv(pod.root, workdir, ["--info-fd", str(write_end), "--", "env", "-i", *_CONTAINER_ENV,
                                            f"HOSTNAME={pod.name}", *argv], ro_binds),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True, pass_fds=(write_end,))
    finally:
        os.close(write_end)
    pod.procs.add(proc)
    info = json.loads(await asyncio.to_thread(_read_all, read_end))
    # child-pid is bwrap's init (PID 1 inside); its child runs the command in the final root.
    init = info["child-pid"]
    for _ in range(500):
        kids = Path(f"/proc/{init}/task/{init}/children").read_text().split()
        if kids:
            pod.ns_pid = int(kids[0])
            return proc
        await asyncio.sleep(0.01)
    raise RuntimeError("the container's process did not start")


def _read_all(fd: int) -> bytes:
    with os.fdopen(fd, "rb") as f:
        return f.read()


async def spawn_exec(pod, argv: list[str], *, stdin: bool) -> asyncio.subprocess.Process:  # type: ignore[no-untyped-def]
    """An exec joins the container's PID and mount namespaces, as `runc exec` does: it sees the pod's
    files and processes, its orphans live on under the container's PID 1, and all die with the pod."""
    proc = await asyncio.create_subprocess_exec(
        "nsenter", "-t", str(pod.ns_pid), "-p", "-m", "-r", "-w", "--", "env", "-i", *_CONTAINER_ENV,
        f"HOSTNAME={pod.name}", *argv,
        stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
    pod.procs.add(proc)
    return proc


async def kill_processes(pod) -> None:  # type: ignore[no-untyped-def]
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
    await asyncio.sleep(double.step_s)
    if container["image"] not in double.images:
        ref = f"docker.io/library/{container['image']}"
        for reason, message in [
            ("ErrImagePull", f'failed to pull and unpack image "{ref}": failed to resolve reference "{ref}": '
                             f"{ref}: not found"),
            ("ImagePullBackOff", f'Back-off pulling image "{container["image"]}"'),
        ]:
            status["containerStatuses"] = [_container_status(container, {"waiting": {"reason": reason,
                                                                                      "message": message}})]
            double._bump(pod, "MODIFIED")
            await asyncio.sleep(double.step_s)
        return
    argv = list(container.get("command") or []) + list(container.get("args") or [])
    proc = await start_container(pod, container.get("workingDir") or "/", argv or ["sleep", "3600"],
                                 double.ro_binds)
    started = _now()
    status["podIP"], status["podIPs"] = "10.244.0.7", [{"ip": "10.244.0.7"}]
    status["phase"] = "Running"
    for cond in status["conditions"]:
        cond.update(status="True", lastTransitionTime=started)
        cond.pop("reason", None), cond.pop("message", None)
    status["containerStatuses"] = [_container_status(container, {"running": {"startedAt": started}}, ready=True)]
    double._bump(pod, "MODIFIED")
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
    status["phase"] = "Succeeded" if exit_code == 0 else "Failed"
    status["containerStatuses"] = [_container_status(container, {"terminated": {
        "exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
        "startedAt": started, "finishedAt": _now()}})]
    double._bump(pod, "MODIFIED")


async def _pump(stream: asyncio.StreamReader, ws: web.WebSocketResponse, channel: int) -> None:
    while chunk := await stream.read(32 * 1024):
        if ws.closed:
            continue  # keep reading so the process never blocks on a full pipe, as a kubelet does
        try:
            await ws.send_bytes(bytes([channel]) + chunk)
        except (ConnectionResetError, RuntimeError):
            pass


async def _feed_stdin(ws: web.WebSocketResponse, proc: asyncio.subprocess.Process, protocol: str) -> None:
    async for msg in ws:
        if msg.type != WSMsgType.BINARY or not msg.data:
            continue
        channel, data = msg.data[0], msg.data[1:]
        if channel == 255 and protocol == V5 and data[:1] == b"\x00" and proc.stdin:
            proc.stdin.close()  # v5 CLOSE signal for stdin
        elif channel == 0 and proc.stdin and not proc.stdin.is_closing():
            proc.stdin.write(data)
            try:
                await proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                pass
        # channel 4 (resize) means nothing without a tty


def exec_status(code: int, command: list[str]) -> bytes:
    """The metav1.Status the kubelet writes on channel 3 when the command ends."""
    if code == 0:
        return json.dumps({"metadata": {}, "status": "Success"}).encode()
    return json.dumps({
        "metadata": {}, "status": "Failure",
        "message": f"command terminated with non-zero exit code: error executing command {command}, "
                   f"exit code {code}",
        "reason": "NonZeroExitCode", "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }).encode()


async def run_exec(double, pod, ws: web.WebSocketResponse, command: list[str], *, stdin: bool,  # type: ignore[no-untyped-def]
                   protocol: str) -> None:
    await ws.send_bytes(b"\x01")  # empty frame on the lowest open output channel: "connected"
    proc = await spawn_exec(pod, command, stdin=stdin)
    feeder = asyncio.create_task(_feed_stdin(ws, proc, protocol))
    assert proc.stdout and proc.stderr
    await asyncio.gather(_pump(proc.stdout, ws, 1), _pump(proc.stderr, ws, 2))
    code = await proc.wait()
    pod.procs.discard(proc)
    # The runtime reports death by signal N as exit code 128+N.
    code = 128 - code if code < 0 else code
    if not ws.closed:
        try:
            await ws.send_bytes(b"\x03" + exec_status(code, command))
            await ws.close()
        except (ConnectionResetError, RuntimeError):
            pass
    feeder.cancel()
