"""The Kubernetes backend: one Pod per rollout, commands and files through the exec subresource.

    pod = build_pod_manifest(...)          # sandbox/k8s_manifests.py, checked before it is sent
    create -> watch until Running          # ImagePullBackOff, Failed, ... -> SandboxError saying why
    exec   -> pods/exec over WebSocket     # sandbox/k8s_exec.py: channels, exit status, tar for files
    stop   -> delete, grace 0

The official `kubernetes` client is synchronous and imported lazily; every call runs in a thread,
each on an `ApiClient` of its own (see k8s_exec.run_exec_stream for why).
What the image must have: `sh`, `timeout`, `head`, `tar` and `sleep` (coreutils or busybox).
"""

from __future__ import annotations

import asyncio
import posixpath
import shlex
import threading
import time
from typing import Any
from urllib.parse import urlparse

from openforge.config import KubernetesSandboxConfig, SandboxConfig
from openforge.errors import SandboxError
from sandbox.base import ExecResult, container_path, SandboxBase, SandboxFileNotFound, SandboxInfo, TransientSandboxError
from sandbox.k8s_exec import (
    RawExec, api_error, first_member, is_not_found, run_exec_stream, tar_one_file, wrap_command,
)
from sandbox.k8s_manifests import (
    CONTAINER_NAME, build_pod_manifest, check_pod_manifest, managed_selector, pod_labels, pod_name,
)

# Waiting reasons after which a pod will not reach Running without someone changing something.
FATAL_WAITING = {
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
    "CreateContainerConfigError", "CreateContainerError", "CrashLoopBackOff", "RunContainerError",
}
FILE_OP_TIMEOUT_S = 120.0
_FILE_MISSING = 44  # exit code of the read script when the path is not a regular file


def _client_module():
    try:
        import kubernetes
    except ImportError:
        raise SandboxError("the kubernetes backend needs the `kubernetes` package: "
                           "pip install 'openforge[k8s]'") from None
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


class KubernetesSandbox(SandboxBase):
    """A rollout's sandbox as one Pod. `proxy_url` is how code in the pod reaches the proxy."""

    def __init__(self, config: SandboxConfig, *, run_id: str, rollout_id: str) -> None:
        self.config = config
        self.k8s = config.kubernetes
        self.run_id, self.rollout_id = run_id, rollout_id
        self.name = pod_name(rollout_id)
        self.proxy_url = self.k8s.proxy_url.rstrip("/")
        self.start_retries = config.start_retries
        self.info = SandboxInfo(backend="kubernetes", sandbox_id=self.name, workdir=config.workdir,
                                proxy_host=urlparse(self.proxy_url).hostname or "127.0.0.1",
                                labels=pod_labels(run_id=run_id, rollout_id=rollout_id))
        self._cfg = None  # kubernetes.client.Configuration, loaded in start()
        self._created = False
        self._stopped = threading.Event()

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._created:
            return
        # A retried start() makes a new pod: the old name may still be terminating.
        self._stopped.clear()
        self.name = self.info.sandbox_id = pod_name(self.rollout_id)
        manifest = build_pod_manifest(self.config, name=self.name, run_id=self.run_id,
                                      rollout_id=self.rollout_id)
        check_pod_manifest(manifest)
        self._cfg = await asyncio.to_thread(load_client_configuration, self.k8s)
        await asyncio.to_thread(self._create, manifest)
        try:
            await asyncio.to_thread(self._wait_running)
            await self._probe()
        except BaseException:
            await self.stop()
            raise

    async def _probe(self) -> None:
        """One exec right away: learn $HOME (harness config goes there) and fail now, with the fix,
        if the image lacks what every later exec relies on."""
        script = 'for t in timeout head tar; do command -v $t >/dev/null || printf "%s " $t; done; echo; echo "$HOME"'
        raw = await asyncio.to_thread(self._stream, ["sh", "-c", script], 30.0, None, 4096)
        missing, _, home = raw.stdout.decode("utf-8", "replace").partition("\n")
        if raw.exit_code != 0 or missing.strip():
            why = f"lacks {missing.strip()}" if missing.strip() else f"cannot run sh ({_why(raw)})"
            raise SandboxError(f"image {self.k8s.image} {why}: the kubernetes backend needs sh, timeout, "
                               "head and tar in the image (coreutils or busybox)")
        self.info.home = home.strip() or "/root"

    def _core(self):
        from kubernetes.client import ApiClient, CoreV1Api

        return CoreV1Api(ApiClient(configuration=self._cfg))

    def _create(self, manifest: dict[str, Any]) -> None:
        core = self._core()
        try:
            core.create_namespaced_pod(self.k8s.namespace, manifest, _request_timeout=30)
        except Exception as exc:  # ApiException (quota, RBAC, invalid) or the transport's error
            raise api_error(f"cannot create pod {self.name} in namespace {self.k8s.namespace}", exc) from None
        finally:
            core.api_client.close()
        self._created = True
        if self._stopped.is_set():  # stop() ran (a cancelled start) while the create was in flight
            self._delete()
            self._created = False
            raise SandboxError(f"pod {self.name}: stopped while starting")

    def _wait_running(self) -> None:
        """Watch the pod until Running; raise SandboxError on a state it will not leave by itself."""
        from kubernetes import watch

        deadline = time.monotonic() + self.k8s.start_timeout_s
        core, last = self._core(), "no status yet"
        try:
            while (remaining := deadline - time.monotonic()) > 0:
                w = watch.Watch()
                # No resourceVersion: the server first sends the pod as it is (ADDED), so a pod that
                # became Running between create and watch is not missed.
                for event in w.stream(core.list_namespaced_pod, self.k8s.namespace,
                                      field_selector=f"metadata.name={self.name}",
                                      timeout_seconds=max(1, int(remaining)), _request_timeout=remaining + 5):
                    if event["type"] == "DELETED":  # evicted, preempted, or someone's gc
                        raise TransientSandboxError(f"pod {self.name} was deleted while starting")
                    state, why = pod_state(event["object"])
                    if state == "running":
                        w.stop()
                        return
                    last = why or last
                    if state == "failed":
                        kind = TransientSandboxError if transient_failure(why) else SandboxError
                        raise kind(f"pod {self.name} cannot start: {why}")
                    if self._stopped.is_set():
                        raise SandboxError(f"pod {self.name}: stopped while starting")
        except SandboxError:
            raise
        except Exception as exc:
            raise api_error(f"watching pod {self.name}", exc) from None
        finally:
            core.api_client.close()
        # A busy cluster (no room yet, an autoscaler adding nodes): worth another try.
        raise TransientSandboxError(f"pod {self.name} not running after {self.k8s.start_timeout_s:g}s: {last}")

    async def stop(self) -> None:
        self._stopped.set()
        if not self._created:
            return
        await asyncio.to_thread(self._delete)
        self._created = False

    def _delete(self) -> None:
        from kubernetes.client import V1DeleteOptions

        core = self._core()
        try:
            for attempt in range(2):
                try:
                    core.delete_namespaced_pod(self.name, self.k8s.namespace, _request_timeout=30,
                                               body=V1DeleteOptions(grace_period_seconds=0))
                    return
                except Exception as exc:
                    if is_not_found(exc):
                        return
                    if attempt == 1:
                        raise api_error(f"cannot delete pod {self.name} (`forge gc` removes it later)",
                                        exc) from None
        finally:
            core.api_client.close()

    # -- exec ------------------------------------------------------------------------------------
    async def exec(self, command: str | list[str], *, timeout: float, env: dict[str, str] | None = None,
                   cwd: str | None = None, max_output: int | None = None, stdin: bytes | None = None,
                   ) -> ExecResult:
        limit = self.config.max_output_bytes if max_output is None else max_output
        argv = wrap_command(command, cwd=self._resolve(cwd or "."), env=env, timeout=timeout,
                            stdin_len=None if stdin is None else len(stdin))
        raw = await asyncio.to_thread(self._stream, argv, timeout, stdin, limit)
        return ExecResult(exit_code=raw.exit_code, stdout=raw.stdout.decode("utf-8", "replace"),
                          stderr=raw.stderr.decode("utf-8", "replace"), timed_out=raw.timed_out,
                          truncated=raw.truncated, duration_s=raw.duration_s)

    def _stream(self, argv: list[str], timeout: float, stdin: bytes | None, limit: int | None) -> RawExec:
        if not self._created or self._stopped.is_set():
            raise SandboxError(f"sandbox {self.name} is not started (or already stopped)")
        core = self._core()
        try:
            return run_exec_stream(core, pod=self.name, namespace=self.k8s.namespace, container=CONTAINER_NAME,
                                   argv=argv, timeout=timeout, stdin=stdin, limit=limit, stopped=self._stopped)
        finally:
            core.api_client.close()

    async def _file_op(self, script: str, stdin: bytes | None, limit: int | None) -> RawExec:
        argv = wrap_command(["sh", "-c", script], cwd="/", env=None, timeout=FILE_OP_TIMEOUT_S,
                            stdin_len=None if stdin is None else len(stdin))
        return await asyncio.to_thread(self._stream, argv, FILE_OP_TIMEOUT_S, stdin, limit)

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
            raise SandboxError(f"cannot write {full} in pod {self.name}: {_why(raw)}")

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        full = self._resolve(path)
        folder, base = posixpath.split(full)
        script = f"[ -f {shlex.quote(full)} ] || exit {_FILE_MISSING}\n"
        if max_bytes is None:
            script += f"tar -c -f - -C {shlex.quote(folder)} -- {shlex.quote(base)}"
        else:
            # A prefix needs no archive, and is cut in the pod rather than after the transfer.
            script += f"head -c {max_bytes} -- {shlex.quote(full)}"
        raw = await self._file_op(script, None, None)
        if raw.exit_code == _FILE_MISSING:
            raise SandboxFileNotFound(f"{path}: no such file in the sandbox (pod {self.name})")
        if raw.exit_code != 0:
            raise SandboxError(f"cannot read {full} in pod {self.name}: {_why(raw)}")
        if max_bytes is not None:
            return raw.stdout
        return first_member(raw.stdout, where=f"{full} in pod {self.name}")


def _why(raw: RawExec) -> str:
    return raw.stderr.decode("utf-8", "replace").strip() or f"exit code {raw.exit_code}"


def pod_state(pod: Any) -> tuple[str, str]:
    """("running" | "pending" | "failed", why) for a V1Pod: the reason a person would want to read."""
    status = pod.status
    phase = (status.phase if status else None) or "Pending"
    containers = (status.container_statuses if status else None) or []
    if phase == "Running" and any(c.state and c.state.running for c in containers):
        return "running", ""
    if phase in ("Succeeded", "Failed"):
        why = " ".join(filter(None, [status.reason, status.message]))
        for c in containers:
            term = c.state.terminated if c.state else None
            if term:
                why = why or f"container {term.reason or 'exited'} (exit code {term.exit_code})"
        return "failed", f"phase {phase}" + (f": {why}" if why else "")
    for c in containers:
        waiting = c.state.waiting if c.state else None
        if waiting and waiting.reason:
            why = f"{waiting.reason}: {waiting.message}" if waiting.message else waiting.reason
            return ("failed" if waiting.reason in FATAL_WAITING else "pending"), why
    for cond in (status.conditions if status else None) or []:
        # Unschedulable is not fatal: a cluster autoscaler may be adding the node right now. It is the
        # reason given if start_timeout_s runs out.
        if cond.type == "PodScheduled" and cond.status == "False":
            return "pending", f"{cond.reason or 'not scheduled'}: {cond.message or ''}".rstrip(": ")
    return "pending", f"phase {phase}"


def transient_failure(why: str) -> bool:
    """Whether a pod that failed to start may start on another try: a registry hiccup or an
    eviction, not an image that does not exist or a secret that is missing."""
    lowered = why.lower()
    if "errimagepull" in lowered or "imagepullbackoff" in lowered:
        return not any(k in lowered for k in ("not found", "unauthorized", "denied", "manifest unknown",
                                              "invalid", "back-off"))
    return any(k in why for k in ("Evicted", "Preempting", "NodeShutdown", "NodeLost", "Terminated"))


def gc_pods(config: SandboxConfig, run_id: str | None = None) -> list[str]:
    """Delete every pod forge made in the configured namespace (of one run if `run_id`); returns names.

    For `forge gc` after a crashed run. Selects by label only, so pods of other tools are never touched.
    """
    from kubernetes.client import ApiClient, CoreV1Api, V1DeleteOptions

    k8s = config.kubernetes
    core = CoreV1Api(ApiClient(configuration=load_client_configuration(k8s)))
    deleted: list[str] = []
    try:
        try:
            pods = core.list_namespaced_pod(k8s.namespace, label_selector=managed_selector(run_id),
                                            _request_timeout=30)
        except Exception as exc:
            raise api_error(f"cannot list pods in namespace {k8s.namespace}", exc) from None
        for pod in pods.items:
            try:
                core.delete_namespaced_pod(pod.metadata.name, k8s.namespace, _request_timeout=30,
                                           body=V1DeleteOptions(grace_period_seconds=0))
            except Exception as exc:
                if not is_not_found(exc):
                    raise api_error(f"cannot delete pod {pod.metadata.name}", exc) from None
            deleted.append(pod.metadata.name)
    finally:
        core.api_client.close()
    return deleted


def cluster_version(config: SandboxConfig) -> str:
    """`v1.31.2 at https://...` for `forge doctor`; SandboxError saying why when the cluster is unreachable."""
    from kubernetes.client import ApiClient, VersionApi

    cfg = load_client_configuration(config.kubernetes)
    api = ApiClient(configuration=cfg)
    try:
        info = VersionApi(api).get_code(_request_timeout=10)
    except Exception as exc:
        raise api_error(f"Kubernetes API at {cfg.host}", exc) from None
    finally:
        api.close()
    return f"{info.git_version} at {cfg.host}"


__all__ = ["KubernetesSandbox", "gc_pods", "cluster_version", "pod_state"]
