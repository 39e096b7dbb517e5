"""The pod as a restricted, shared, well-behaved tenant, against the API double: Pod Security
`restricted`, the user and filesystem it runs with, kill_all, OOM, CreateContainerError, throttling,
one watch and one client for every pod, graceful delete."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import psutil
import pytest
from tests.k8s_double import KubeDouble
from kubernetes.client import ApiClient, CoreV1Api
from kubernetes.client.rest import ApiException
from tests.helpers.kubernetes import double, make_config, pytestmark, restricted_pod  # noqa: F401

from openforge.errors import SandboxError
from openforge.sandbox.base import TransientSandboxError
from openforge.sandbox.k8s_throttle import RateLimiter, backoff_s
from openforge.sandbox.k8s_exec import api_error
from openforge.sandbox.kubernetes import KubernetesSandbox, load_client_configuration


def core_for(config) -> CoreV1Api:  # type: ignore[no-untyped-def]
    return CoreV1Api(ApiClient(load_client_configuration(config)))


async def test_the_pod_runs_restricted(double: KubeDouble, tmp_path: Path) -> None:
    async with KubernetesSandbox(make_config(double, tmp_path), run_id="r", rollout_id="ro-sec") as sb:
        r = await sb.exec("id -u; id -g; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; echo $HOME", timeout=10)
        assert r.stdout.split() == ["1000", "1000", "CapEff:", "0000000000000000", "NoNewPrivs:", "1",
                                    "/home/forge"]
        r = await sb.exec("touch /etc/x /usr/x /x 2>&1; touch $HOME/.rc /tmp/t ./w && echo writable", timeout=10)
        assert r.stdout.count("Read-only file system") == 3 and r.stdout.endswith("writable\n")
        await sb.write_file("deep/er/f.txt", b"ok")  # tar -x as the pod's user, into the workdir volume
        assert await sb.read_file("deep/er/f.txt") == b"ok"


async def test_a_non_compliant_pod_is_refused_as_the_apiserver_does(double: KubeDouble, tmp_path: Path) -> None:
    core = core_for(make_config(double, tmp_path))
    bare = {"metadata": {"name": "bare"}, "spec": {"containers": [{"name": "c", "image": "openforge:test"}]}}
    with pytest.raises(ApiException) as info:
        core.create_namespaced_pod("openforge", bare)
    err = api_error("cannot create pod bare", info.value)
    assert not isinstance(err, TransientSandboxError)  # a refusal, not retried
    assert 'HTTP 403 Forbidden: pods "bare" is forbidden: violates PodSecurity "restricted:latest": ' \
           'allowPrivilegeEscalation != false (container "c" must set' in str(err)
    core.create_namespaced_pod("default", bare)  # an unlabelled namespace admits it
    core.api_client.close()


async def test_kill_all_leaves_only_the_keeper(double: KubeDouble, tmp_path: Path) -> None:
    async with KubernetesSandbox(make_config(double, tmp_path), run_id="r", rollout_id="ro-kill") as sb:
        # Servers an agent might leave, out of the exec reaper's sight (no marker in their environment):
        # daemonised, in their own session, ignoring TERM.
        await sb.exec("(setsid env -i /bin/sh -c 'trap \"\" TERM; /bin/sleep 300 & wait' >/dev/null 2>&1 &); "
                      "env -i /usr/bin/nohup /bin/sleep 300 >/dev/null 2>&1 & sleep 0.5", timeout=10)
        # (the pause: until both have exec'd `env -i`, they still carry the marker the reaper looks for)
        await sb.write_file("kept.txt", b"still here")
        # The agent's sleeps, by their exact argv (the listing's own shell only mentions them).
        ps = ("for p in /proc/[0-9]*; do c=$(tr '\\0' ' ' < $p/cmdline 2>/dev/null); "
              "[ \"$c\" = '/bin/sleep 300 ' ] && echo ${p#/proc/}; done; true")
        assert len((await sb.exec(ps, timeout=10)).stdout.split()) == 2
        await sb.kill_all()
        assert (await sb.exec(ps, timeout=10)).stdout == ""
        assert await sb.read_file("kept.txt") == b"still here"
        assert (await sb.exec("echo alive", timeout=10)).stdout == "alive\n"


async def test_orphans_are_reaped_by_pid_1(double: KubeDouble, tmp_path: Path) -> None:
    async with KubernetesSandbox(make_config(double, tmp_path), run_id="r", rollout_id="ro-reap") as sb:
        for _ in range(3):  # each exec's leftovers are killed by its reaper and reparent to PID 1
            await sb.exec("sleep 30 & echo", timeout=10)
        await asyncio.sleep(0.3)
        r = await sb.exec("grep -l '^State:.*Z' /proc/[0-9]*/status | wc -l", timeout=10)
        assert r.stdout.strip() == "0"


async def test_oom_kill_is_reported_as_such(tmp_path: Path) -> None:
    d = KubeDouble(tmp_path / "pods", enforce_memory=True)
    d.start()
    try:
        config = make_config(d, tmp_path, memory_request="32Mi", memory_limit="64Mi")
        async with KubernetesSandbox(config, run_id="r", rollout_id="ro-oom") as sb:
            with pytest.raises(SandboxError, match=r"was OOMKilled: .*memory limit 64Mi .*OOMKilled \(exit code 137\)"):
                await sb.exec(["python3", "-c", "import time; x = bytearray(200 << 20); time.sleep(30)"], timeout=20)
    finally:
        d.stop()


async def test_create_container_error_is_retried_a_bounded_number_of_times(tmp_path: Path) -> None:
    d = KubeDouble(tmp_path / "pods", create_container_errors=2)
    d.start()
    try:
        async with KubernetesSandbox(make_config(d, tmp_path), run_id="r", rollout_id="ro-cce") as sb:
            assert (await sb.exec("echo up", timeout=10)).stdout == "up\n"  # the kubelet's retry worked
        d.create_container_errors = 9
        config = make_config(d, tmp_path, retries=1, create_error_retries=3)
        with pytest.raises(TransientSandboxError, match=r"CreateContainerError: .*name is reserved \(4 times\)"):
            async with KubernetesSandbox(config, run_id="r", rollout_id="ro-cce2"):
                pass
        assert len([p for m, p, q in d.requests if m == "POST"]) == 1 + 2  # one try each, bounded
    finally:
        d.stop()


async def test_throttling_honours_retry_after(tmp_path: Path) -> None:
    d = KubeDouble(tmp_path / "pods", throttle_creates=2)
    d.start()
    try:
        sb = KubernetesSandbox(make_config(d, tmp_path), run_id="r", rollout_id="ro-429")
        t0 = time.monotonic()
        async with sb:
            cluster = sb._cluster
            assert cluster is not None and cluster.calls["throttled"] == 2
        assert time.monotonic() - t0 >= 2.0  # Retry-After: 1, twice (plus jitter)
        assert len([p for m, p, q in d.requests if m == "POST"]) == 3
    finally:
        d.stop()


def test_rate_limits_and_backoff() -> None:
    limiter = RateLimiter(per_second=10, burst=5)
    waits = [limiter.reserve() for _ in range(15)]
    assert waits[:5] == [0.0] * 5  # the burst goes at once
    assert 0.9 <= waits[-1] <= 1.05  # then 10 per second
    assert all(1.0 <= backoff_s(0, 1.0) <= 1.5 for _ in range(50))  # Retry-After, plus up to 50% jitter
    assert all(0.5 <= backoff_s(0, None) <= 0.75 for _ in range(50)) and backoff_s(9, None) <= 22.5


async def test_pods_share_one_client_one_watch(double: KubeDouble, tmp_path: Path) -> None:
    config = make_config(double, tmp_path)
    boxes = [KubernetesSandbox(config, run_id="r", rollout_id=f"ro-{i}") for i in range(6)]
    await asyncio.gather(*(b.start() for b in boxes))
    try:
        assert len({id(b._cluster) for b in boxes}) == 1
        watches = [q for m, p, q in double.requests if q.get("watch") == "true"]
        assert len(watches) == 1 and "fieldSelector" not in watches[0]
        assert not [p for m, p, q in double.requests if m == "GET" and "/pods/" in p and not p.endswith("/exec")]
        threads = {t.name for t in __import__("threading").enumerate()}
        assert sum(name.startswith("forge-k8s-watch") for name in threads) == 1
    finally:
        await asyncio.gather(*(b.stop() for b in boxes))


async def test_stop_deletes_gracefully_and_waits_for_the_processes(double: KubeDouble, tmp_path: Path) -> None:
    sb = KubernetesSandbox(make_config(double, tmp_path, delete_grace_s=7), run_id="r", rollout_id="ro-del")
    await sb.start()
    pod = double.pods[("openforge", sb.name)]
    await sb.exec("(setsid sleep 60 >/dev/null 2>&1 &)", timeout=10)
    t0 = time.monotonic()
    await sb.stop()
    assert time.monotonic() - t0 < 5  # PID 1 ends on TERM: no waiting out the grace period
    deleted = [obj for _, etype, obj in double.events if etype == "DELETED" and obj["metadata"]["name"] == sb.name]
    assert deleted and deleted[0]["metadata"]["deletionGracePeriodSeconds"] == 7
    assert not psutil.pid_exists(pod.ns_pid) and all(p.returncode is not None for p in pod.procs)


async def test_the_double_lets_a_force_delete_outlive_the_call(double: KubeDouble, tmp_path: Path) -> None:
    # Why the backend does not delete with grace 0: the object goes, the processes a moment later.
    config = make_config(double, tmp_path)
    core = core_for(config)
    core.create_namespaced_pod("openforge", restricted_pod("forced"))
    for _ in range(200):
        pod = double.pods.get(("openforge", "forced"))
        if pod and pod.obj["status"]["phase"] == "Running":
            break
        await asyncio.sleep(0.02)
    from kubernetes.client import V1DeleteOptions

    core.delete_namespaced_pod("forced", "openforge", body=V1DeleteOptions(grace_period_seconds=0))
    assert ("openforge", "forced") not in double.pods and psutil.pid_exists(pod.ns_pid)
    await asyncio.sleep(1.5)
    assert not psutil.pid_exists(pod.ns_pid)
    core.api_client.close()


async def test_the_shared_watch_resumes_and_relists_after_410(double: KubeDouble, tmp_path: Path) -> None:
    # The server ends watches early; meanwhile history is compacted: resuming gets 410, the watch
    # lists again and goes on, and sandboxes waiting on it never notice.
    double.watch_timeout_s = 0.3
    config = make_config(double, tmp_path)
    first = KubernetesSandbox(config, run_id="r", rollout_id="ro-a")
    await first.start()
    try:
        double.compact()
        await asyncio.sleep(0.8)  # at least one resume, answered 410
        second = KubernetesSandbox(config, run_id="r", rollout_id="ro-b")
        async with second:
            assert (await second.exec("echo ok", timeout=10)).stdout == "ok\n"
        lists = [q for m, p, q in double.requests if m == "GET" and p.endswith("/pods") and q.get("watch") != "true"]
        watches = [q for m, p, q in double.requests if q.get("watch") == "true"]
        assert len(lists) >= 2 and len(watches) >= 3
        assert all(q.get("resourceVersion") for q in watches)  # always resumed from a version, never a gap
    finally:
        await first.stop()


async def test_more_execs_than_threads_queue_and_say_so(double: KubeDouble, tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    async with KubernetesSandbox(make_config(double, tmp_path, max_threads=4), run_id="r", rollout_id="ro-q") as sb:
        t0 = time.monotonic()
        results = await asyncio.gather(*(sb.exec("sleep 0.5; echo $0", timeout=10) for _ in range(8)))
        assert all(r.exit_code == 0 for r in results)
        assert time.monotonic() - t0 >= 1.0  # 8 execs of 0.5 s on 4 threads: two rounds, none lost
    assert "set max_threads to at least 2 x runner.concurrency" in caplog.text
