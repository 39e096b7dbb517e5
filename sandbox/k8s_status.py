"""Reading a pod's status the way a person would want it explained: is it running, still starting,
or never going to, and why; and after an exec broke, what happened to the pod."""

from __future__ import annotations

from typing import Any

# Waiting reasons after which a pod will not reach Running without someone changing something.
# CreateContainerError is not here: the kubelet retries it, and it is often transient (a runtime
# timeout, a name still held by the previous attempt); the backend tolerates a bounded number.
FATAL_WAITING = {
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
    "CreateContainerConfigError", "CrashLoopBackOff", "RunContainerError",
}


def pod_state(pod: Any) -> tuple[str, str]:
    """("running" | "pending" | "failed", why) for a V1Pod: the reason a person would want to read."""
    status = pod.status
    phase = (status.phase if status else None) or "Pending"
    containers = (status.container_statuses if status else None) or []
    terminated = [c for c in containers if c.state and c.state.terminated]
    # Every container: a task's compose services run beside the agent's (k8s_manifests.py), and the phase
    # is Running as soon as one of them is.
    if phase == "Running" and containers and all(c.state and c.state.running for c in containers):
        return "running", ""
    if phase in ("Succeeded", "Failed") or (phase == "Running" and terminated):
        why = " ".join(filter(None, [status.reason, status.message]))
        for c in terminated:
            term, who = c.state.terminated, f"container {c.name} " if len(containers) > 1 else "container "
            why = why or f"{who}{term.reason or 'exited'} (exit code {term.exit_code})"
        return "failed", f"phase {phase}" + (f": {why}" if why else "")
    waiting = [c for c in containers if c.state and c.state.waiting and c.state.waiting.reason]
    # A container that will never start outweighs one still being created (a service's image not found).
    for c in sorted(waiting, key=lambda c: c.state.waiting.reason not in FATAL_WAITING):
        reason, message = c.state.waiting.reason, c.state.waiting.message
        why = f"{reason}: {message}" if message else reason
        why = f"container {c.name}: {why}" if len(containers) > 1 else why
        return ("failed" if reason in FATAL_WAITING else "pending"), why
    for cond in (status.conditions if status else None) or []:
        # Unschedulable is not fatal: a cluster autoscaler may be adding the node right now. It is the
        # reason given if start_timeout_s runs out.
        if cond.type == "PodScheduled" and cond.status == "False":
            return "pending", f"{cond.reason or 'not scheduled'}: {cond.message or ''}".rstrip(": ")
    return "pending", f"phase {phase}"


def waiting_reason(pod: Any) -> str:
    for c in (pod.status.container_statuses if pod.status else None) or []:
        if c.state and c.state.waiting and c.state.waiting.reason:
            return c.state.waiting.reason
    return ""


def death_reason(pod: Any, *, memory_limit: str) -> str:
    """Why a pod that was running is not any more ("" while it runs). An OOM kill says so: with
    cgroup v2 the kernel kills every process of the container at once (memory.oom.group), so the
    exec in flight ends with 137 or a broken stream and only the pod's status tells why."""
    if pod is None:
        return ""
    state, why = pod_state(pod)
    if state != "failed":
        return ""
    if "OOMKilled" in why:
        return f"was OOMKilled: its processes used more than the memory limit {memory_limit} ({why})"
    return f"ended: {why}"


def transient_failure(why: str) -> bool:
    """Whether a pod that failed to start may start on another try: a registry hiccup or an
    eviction, not an image that does not exist or a secret that is missing."""
    lowered = why.lower()
    if "errimagepull" in lowered or "imagepullbackoff" in lowered:
        return not any(k in lowered for k in ("not found", "unauthorized", "denied", "manifest unknown",
                                              "invalid", "back-off"))
    return any(k in why for k in ("Evicted", "Preempting", "NodeShutdown", "NodeLost", "Terminated",
                                  "CreateContainerError"))
