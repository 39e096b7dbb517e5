"""What every pod of one forge shares on one cluster: one API client, one executor, one watch, the
rate limits. `ClusterClient.acquire(config, home)` returns the shared one (made on first use, closed a
few seconds after the last sandbox releases it).

Why shared: hundreds of rollouts at once would otherwise each open their own TCP+TLS connection per
call, hold a default-pool thread per watch (the pool the store and the proxy's tokenizer use), and
put one watch per pod on the API server. Here:

- one `ApiClient` (its urllib3 pool sized to the executor) for every REST call and exec;
- one `ThreadPoolExecutor` of `max_threads`, used by nothing else: the client is synchronous, and a
  running exec holds a thread for its whole command;
- one label-selected watch (`openforge.managed=1,openforge.home=<this data dir>`), informer style:
  list, then watch from the list's resourceVersion, relist on 410 Gone; each pod's latest object is
  cached and handed to the sandbox waiting on it, with no thread of its own;
- client-side rate limits: `api_qps`/`api_burst` over every call, `max_pods_per_minute` over creates;
  a 429 (or 503) is retried after the server's Retry-After, or a jittered exponential backoff.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openforge.config import KubernetesSandboxConfig
from openforge.sandbox.k8s_exec import ApiCallError, api_error
from openforge.sandbox.k8s_throttle import MAX_THROTTLE_RETRIES, RateLimiter, backoff_s
from openforge.sandbox.k8s_manifests import home_label, managed_selector

log = logging.getLogger(__name__)
IDLE_CLOSE_S = 5.0  # a client nobody holds is closed after this long (the next step makes a new one)
_WATCH_WINDOW_S = 240  # one watch request; the server ends it, we go on from its last resourceVersion


@dataclass
class PodWaiter:
    """A sandbox's view of its pod: the latest object the shared watch saw, and a wake-up when it changes."""

    loop: asyncio.AbstractEventLoop
    pod: Any = None  # V1Pod
    deleted: bool = False
    error: ApiCallError | None = None  # the watch itself cannot list/watch (RBAC, credentials)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def _apply(self, etype: str, obj: Any) -> None:
        if etype == "ERROR":
            self.error = obj
        elif etype == "DELETED":
            self.deleted, self.pod = True, obj
        else:
            self.pod = obj
        self.changed.set()

    async def wait_change(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self.changed.wait(), max(0.0, timeout))
        except TimeoutError:
            return False
        self.changed.clear()
        return True


class ClusterClient:
    _registry: dict[str, "ClusterClient"] = {}
    _registry_lock = threading.Lock()

    def __init__(self, k8s: KubernetesSandboxConfig, home: Path, cfg: Any) -> None:
        from kubernetes.client import ApiClient, CoreV1Api

        self.k8s, self.home_label = k8s, home_label(home)
        cfg.connection_pool_maxsize = max(k8s.max_threads + 4, 8)
        self.api = ApiClient(configuration=cfg)
        self.core = CoreV1Api(self.api)
        self.executor = ThreadPoolExecutor(max_workers=k8s.max_threads, thread_name_prefix="forge-k8s")
        self.qps = RateLimiter(k8s.api_qps, k8s.api_burst)
        self.creates = RateLimiter(k8s.max_pods_per_minute / 60.0, max(1, k8s.max_pods_per_minute // 6))
        self.calls: Counter[str] = Counter()  # API requests by kind, for the bench and the tests
        self.selector = managed_selector(home=home)
        self._refs, self._closed, self._idle_timer = 0, False, None
        self._running, self._warned_full = 0, False  # blocking calls in the executor (or queued for it)
        self._lock = threading.Lock()
        self._waiters: dict[str, list[PodWaiter]] = {}
        self._cache: dict[str, Any] = {}
        self._watch_thread: threading.Thread | None = None
        self._watch = None

    # -- sharing ---------------------------------------------------------------------------------
    @classmethod
    def acquire(cls, k8s: KubernetesSandboxConfig, home: Path, load_cfg: Callable[[], Any]) -> "ClusterClient":
        key = json.dumps([k8s.model_dump(mode="json"), str(home)], sort_keys=True)
        with cls._registry_lock:
            client = cls._registry.get(key)
            if client is None or client._closed:
                client = cls._registry[key] = cls(k8s, home, load_cfg())
            with client._lock:
                client._refs += 1
                if client._idle_timer:
                    client._idle_timer.cancel()
                    client._idle_timer = None
            client._key = key
        return client

    def release(self) -> None:
        with self._lock:
            self._refs -= 1
            if self._refs > 0 or self._closed:
                return
            self._idle_timer = threading.Timer(IDLE_CLOSE_S, self._close_if_idle)
            self._idle_timer.daemon = True
            self._idle_timer.start()

    def _close_if_idle(self) -> None:
        with ClusterClient._registry_lock, self._lock:
            if self._refs > 0 or self._closed:
                return
            self._closed = True
            if ClusterClient._registry.get(self._key) is self:
                del ClusterClient._registry[self._key]
        if self._watch is not None:
            self._watch.stop()
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.api.close()

    # -- calls -----------------------------------------------------------------------------------
    async def call(self, kind: str, fn: Callable[..., Any], *args: Any, create: bool = False, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` in the executor under the rate limits; throttling retried. Raises the
        original exception (ApiException or transport) when it is not throttling or retries run out."""
        loop = asyncio.get_running_loop()
        for attempt in range(MAX_THROTTLE_RETRIES + 1):
            wait = self.creates.reserve() if create else 0.0
            await asyncio.sleep(max(wait, self.qps.reserve()))
            self.calls[kind] += 1
            try:
                return await loop.run_in_executor(self.executor, lambda: fn(*args, **kwargs))
            except Exception as exc:
                status = getattr(exc, "status", None)
                if status not in (429, 503) or attempt == MAX_THROTTLE_RETRIES:
                    raise
                self.calls["throttled"] += 1
                await asyncio.sleep(backoff_s(attempt, api_error("", exc).retry_after))
        raise AssertionError("unreachable")  # pragma: no cover

    async def run_blocking(self, kind: str, fn: Callable[[], Any]) -> Any:
        """A long blocking call (an exec) in the executor, counted and rate limited like the others."""
        await asyncio.sleep(self.qps.reserve())
        self.calls[kind] += 1
        self._running += 1
        if self._running > self.k8s.max_threads and not self._warned_full:
            self._warned_full = True  # execs now queue behind each other: say once what to change
            log.warning("kubernetes backend: %d execs at once, %d threads (sandbox.max_threads): the rest wait; "
                        "set max_threads to at least 2 x runner.concurrency", self._running, self.k8s.max_threads)
        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, fn)
        finally:
            self._running -= 1

    # -- the shared watch ------------------------------------------------------------------------
    def subscribe(self, name: str) -> PodWaiter:
        """Follow pod `name` (call before creating it: nothing between is missed)."""
        waiter = PodWaiter(loop=asyncio.get_running_loop())
        with self._lock:
            self._waiters.setdefault(name, []).append(waiter)
            if name in self._cache:
                waiter.pod = self._cache[name]
            if self._watch_thread is None:
                self._watch_thread = threading.Thread(target=self._watch_loop, daemon=True,
                                                      name=f"forge-k8s-watch-{self.k8s.namespace}")
                self._watch_thread.start()
        return waiter

    def unsubscribe(self, name: str, waiter: PodWaiter) -> None:
        with self._lock:
            waiters = self._waiters.get(name, [])
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters:
                self._waiters.pop(name, None)

    def _dispatch(self, etype: str, name: str, obj: Any) -> None:
        with self._lock:
            if etype == "DELETED":
                self._cache.pop(name, None)
            else:
                self._cache[name] = obj
            waiters = list(self._waiters.get(name, []))
        self._notify(waiters, etype, obj)

    @staticmethod
    def _notify(waiters: list[PodWaiter], etype: str, obj: Any) -> None:
        for w in waiters:
            try:
                w.loop.call_soon_threadsafe(w._apply, etype, obj)
            except RuntimeError:  # its event loop is closed: a sandbox abandoned without stop()
                pass

    def _fail_all(self, err: ApiCallError) -> None:
        with self._lock:
            waiters = [w for ws in self._waiters.values() for w in ws]
        self._notify(waiters, "ERROR", err)

    def _relist(self) -> str:
        self.calls["list"] += 1
        pods = self.core.list_namespaced_pod(self.k8s.namespace, label_selector=self.selector, _request_timeout=60)
        seen = {p.metadata.name for p in pods.items}
        with self._lock:
            gone = [n for n in self._cache if n not in seen]
        for name in gone:  # deleted while no watch was open
            self._dispatch("DELETED", name, self._cache.get(name))
        for pod in pods.items:
            self._dispatch("SYNC", pod.metadata.name, pod)
        return pods.metadata.resource_version

    def _watch_loop(self) -> None:
        from kubernetes import watch

        rv, failures = None, 0
        while not self._closed:
            try:
                if rv is None:
                    rv = self._relist()
                self._watch = w = watch.Watch()
                self.calls["watch"] += 1
                for event in w.stream(self.core.list_namespaced_pod, self.k8s.namespace,
                                      label_selector=self.selector, resource_version=rv,
                                      allow_watch_bookmarks=True, timeout_seconds=_WATCH_WINDOW_S,
                                      _request_timeout=_WATCH_WINDOW_S + 30):
                    obj = event["object"]
                    rv = obj.metadata.resource_version or rv
                    if event["type"] != "BOOKMARK":
                        self._dispatch(event["type"], obj.metadata.name, obj)
                    if self._closed:
                        return
                failures = 0
            except Exception as exc:
                if self._closed:
                    return
                err = api_error(f"watching pods in namespace {self.k8s.namespace}", exc)
                if err.status == 410:  # our resourceVersion is too old: start again from a fresh list
                    rv = None
                    continue
                if err.status in (401, 403, 404):
                    self._fail_all(err)
                failures += 1
                time.sleep(backoff_s(min(failures, 5), err.retry_after))

    # -- introspection ---------------------------------------------------------------------------
    def cached(self, name: str) -> Any:
        with self._lock:
            return self._cache.get(name)
