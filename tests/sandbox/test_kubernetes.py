"""The Kubernetes backend, unchanged, against the API double (tests/k8s_double): the official client
talks REST, watch streams and the exec WebSocket subprotocol to it over loopback."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest
from tests.helpers.kubernetes import double, make_config, pytestmark, restricted_pod  # noqa: F401 - fixtures
from tests.k8s_double import V4, V5, KubeDouble

from openforge.config import KubernetesSandboxConfig
from openforge.errors import SandboxError
from openforge.sandbox.base import Sandbox, SandboxFileNotFound, TransientSandboxError
from openforge.paths import forge_home
from openforge.sandbox.k8s_manifests import home_label
from openforge.sandbox.kubernetes import KubernetesSandbox, cluster_version, gc_pods


async def test_start_exec_files_stop(double: KubeDouble, tmp_path: Path) -> None:
    sb = KubernetesSandbox(make_config(double, tmp_path), run_id="run-a", rollout_id="ro-1")
    assert isinstance(sb, Sandbox)
    async with sb:
        pod = double.pods[("openforge", sb.name)]
        assert pod.obj["status"]["phase"] == "Running"
        assert pod.obj["metadata"]["labels"] == {"openforge.managed": "1", "openforge.run": "run-a",
                                                 "openforge.rollout": "ro-1",
                                                 "openforge.home": home_label(forge_home())}
        assert sb.info.backend == "kubernetes" and sb.info.sandbox_id == sb.name
        assert sb.info.proxy_host == "forge-proxy.openforge" and sb.proxy_url.endswith(":8700")

        r = await sb.exec("echo out; echo err >&2; pwd; exit 3", timeout=10)
        assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (3, "out\n/workspace\n", "err\n", False)
        r = await sb.exec(["printf", "%s|", "a b", "$HOME", "it's"], timeout=10)
        assert r.stdout == "a b|$HOME|it's|"  # a list is argv: no shell expansion, quotes survive
        r = await sb.exec("echo \"$GREETING\"; cat", timeout=10, env={"GREETING": "hi there"}, stdin=b"piped\n")
        assert r.stdout == "hi there\npiped\n"

        blob = bytes(range(256)) * 40
        await sb.write_file("sub/dir/blob.bin", blob, mode=0o755)
        assert await sb.read_file("sub/dir/blob.bin") == blob
        assert await sb.read_file("/workspace/sub/dir/blob.bin", max_bytes=10) == blob[:10]
        r = await sb.exec("stat -c %a blob.bin", timeout=10, cwd="sub/dir")
        assert r.stdout.strip() == "755"
        assert (pod.root / "workspace/sub/dir/blob.bin").read_bytes() == blob  # really in the pod's fs
        with pytest.raises(SandboxFileNotFound):
            await sb.read_file("nope.txt")
        with pytest.raises(SandboxError, match="leaves the sandbox"):
            await sb.write_file("../escape.txt", b"x")
        assert sb.info.home == "/home/forge"
        r = await sb.exec("true", timeout=10, cwd="missing-dir")
        assert r.exit_code != 0 and "missing-dir" in r.stderr
    assert ("openforge", sb.name) not in double.pods
    assert not pod.root.exists()
    await sb.stop()  # idempotent
    with pytest.raises(SandboxError, match="not started"):
        await sb.exec("true", timeout=5)


async def test_exit_codes_signals_and_output_limit(double: KubeDouble, tmp_path: Path) -> None:
    async with KubernetesSandbox(make_config(double, tmp_path), run_id="run-a", rollout_id="ro-2") as sb:
        assert (await sb.exec("true", timeout=10)).exit_code == 0
        assert (await sb.exec(["sh", "-c", "exit 42"], timeout=10)).exit_code == 42
        missing = await sb.exec("no-such-program", timeout=10)
        assert missing.exit_code == 127 and "not found" in missing.stderr
        assert (await sb.exec("kill -9 $$", timeout=10)).exit_code == 128 + 9  # as a shell says it
        big = await sb.exec("head -c 200000 /dev/zero | tr '\\0' a; echo done >&2", timeout=10, max_output=1000)
        assert big.truncated and big.stdout == "a" * 1000 and big.stderr == "done\n" and big.exit_code == 0


async def test_timeout_kills_everything_the_command_started(double: KubeDouble, tmp_path: Path) -> None:
    async with KubernetesSandbox(make_config(double, tmp_path), run_id="run-a", rollout_id="ro-3") as sb:
        t0 = time.monotonic()
        background, stubborn = await asyncio.gather(
            sb.exec("(sleep 1.5; touch late) & echo started; sleep 30", timeout=0.5),
            # A TERM-ignoring command is KILLed after the grace period and still reported as a timeout.
            sb.exec("trap '' TERM; sleep 30", timeout=0.5))
        assert background.timed_out and background.exit_code == 124 and background.stdout == "started\n"
        assert stubborn.timed_out and stubborn.exit_code == 124
        assert time.monotonic() - t0 < 6
        await asyncio.sleep(max(0.0, 1.8 - (time.monotonic() - t0)))
        assert (await sb.exec("test -e late", timeout=10)).exit_code == 1  # the background child died too


async def test_concurrent_execs_on_one_sandbox(double: KubeDouble, tmp_path: Path) -> None:
    async with KubernetesSandbox(make_config(double, tmp_path), run_id="run-a", rollout_id="ro-4") as sb:
        results = await asyncio.gather(*(sb.exec(f"sleep 0.2; echo {i}", timeout=10) for i in range(4)),
                                       sb.write_file("f.txt", b"x"))
        assert [r.stdout for r in results[:4]] == [f"{i}\n" for i in range(4)]


async def test_v4_only_server_stdin_still_reaches_eof(tmp_path: Path) -> None:
    # An apiserver older than v1.30 offers v4 only: no way to close stdin, `head -c N` must end it.
    d = KubeDouble(tmp_path / "pods", protocols=(V4,))
    d.start()
    try:
        async with KubernetesSandbox(make_config(d, tmp_path), run_id="r", rollout_id="ro-v4") as sb:
            assert (await sb.exec("wc -c", timeout=10, stdin=b"12345")).stdout.strip() == "5"
            await sb.write_file("a.txt", b"hello")
            assert await sb.read_file("a.txt") == b"hello"
        assert d.exec_protocols and set(d.exec_protocols) == {V4}
    finally:
        d.stop()


async def test_start_waits_through_a_watch_not_polling(tmp_path: Path) -> None:
    d = KubeDouble(tmp_path / "pods", step_s=0.3)
    d.start()
    try:
        sb = KubernetesSandbox(make_config(d, tmp_path), run_id="r", rollout_id="ro-w")
        t0 = time.monotonic()
        await sb.start()
        elapsed = time.monotonic() - t0
        assert 0.6 <= elapsed < 3  # it followed Pending -> ContainerCreating -> Running as they happened
        watches = [q for m, path, q in d.requests if path.endswith("/pods") and q.get("watch") == "true"]
        assert watches and watches[0]["labelSelector"] == f"openforge.managed=1,openforge.home={home_label(forge_home())}"
        assert not [p for m, p, q in d.requests if m == "GET" and p.endswith(f"/pods/{sb.name}")]
        await sb.stop()
    finally:
        d.stop()
    assert V5 in d.exec_protocols or not d.exec_protocols


async def test_missing_image_says_why_and_cleans_up(double: KubeDouble, tmp_path: Path) -> None:
    sb = KubernetesSandbox(make_config(double, tmp_path, image="ghcr.io/acme/nope:1"), run_id="r", rollout_id="ro")
    with pytest.raises(SandboxError, match=r"cannot start: (ErrImagePull|ImagePullBackOff): .*not found") as info:
        await sb.start()
    assert not isinstance(info.value, TransientSandboxError)  # a missing image is not retried
    assert not double.pods


async def test_unschedulable_reports_the_scheduler_message_at_timeout(double: KubeDouble, tmp_path: Path) -> None:
    config = make_config(double, tmp_path, retries=1, node_selector={"pool": "gpu"}, start_timeout_s=0.5)
    with pytest.raises(TransientSandboxError,
                       match=r"not running after 0.5s: Unschedulable: 0/1 nodes .*node affinity/selector"):
        async with KubernetesSandbox(config, run_id="r", rollout_id="ro"):
            pass
    assert not double.pods
    creates = [p for m, p, q in double.requests if m == "POST"]
    assert len(creates) == 2  # a busy cluster is retried, a bounded number of times, each pod removed


async def test_taints_need_tolerations(tmp_path: Path) -> None:
    d = KubeDouble(tmp_path / "pods", node_labels={"pool": "gpu"},
                   node_taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    d.start()
    try:
        plain = make_config(d, tmp_path, node_selector={"pool": "gpu"}, start_timeout_s=0.5)
        with pytest.raises(SandboxError, match=r"untolerated taint \{nvidia.com/gpu: present\}"):
            await KubernetesSandbox(plain, run_id="r", rollout_id="ro").start()
        tolerant = make_config(d, tmp_path, node_selector={"pool": "gpu"}, tolerations=[
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
        async with KubernetesSandbox(tolerant, run_id="r", rollout_id="ro") as sb:
            assert (await sb.exec("echo ok", timeout=10)).stdout == "ok\n"
    finally:
        d.stop()


async def test_api_refusals_are_one_clear_line(tmp_path: Path) -> None:
    d = KubeDouble(tmp_path / "pods", max_pods=1)
    d.start()
    try:
        async with KubernetesSandbox(make_config(d, tmp_path), run_id="r", rollout_id="ro-1"):
            second = KubernetesSandbox(make_config(d, tmp_path), run_id="r", rollout_id="ro-2")
            with pytest.raises(SandboxError, match=r"HTTP 403 .*exceeded quota"):
                await second.start()
        with pytest.raises(SandboxError, match=r'HTTP 404 .*namespaces "elsewhere" not found'):
            await KubernetesSandbox(make_config(d, tmp_path, namespace="elsewhere"), run_id="r",
                                    rollout_id="ro").start()
        stale = make_config(d, tmp_path)
        d.token = "rotated"
        with pytest.raises(SandboxError, match=r"HTTP 401 .*Unauthorized"):
            await KubernetesSandbox(stale, run_id="r", rollout_id="ro").start()
    finally:
        d.stop()
    with pytest.raises(SandboxError, match="cannot create pod"):  # nothing listens there any more
        await KubernetesSandbox(make_config(d, tmp_path, start_timeout_s=2), run_id="r", rollout_id="ro").start()
    bad = KubernetesSandboxConfig(kubeconfig=str(tmp_path / "absent"))
    with pytest.raises(SandboxError, match="cannot load Kubernetes credentials"):
        await KubernetesSandbox(bad, run_id="r", rollout_id="ro").start()


async def test_gc_deletes_managed_pods_by_label_only(double: KubeDouble, tmp_path: Path) -> None:
    config = make_config(double, tmp_path)
    boxes = [KubernetesSandbox(config, run_id=run, rollout_id=f"ro-{i}") for i, run in enumerate(["a", "a", "b"])]
    await asyncio.gather(*(b.start() for b in boxes))
    from kubernetes.client import ApiClient, CoreV1Api

    from openforge.sandbox.kubernetes import load_client_configuration

    core = CoreV1Api(ApiClient(load_client_configuration(config)))
    core.create_namespaced_pod("openforge", restricted_pod("someone-else", {"app": "x"}))
    # Another forge (another data dir) sharing the namespace: its pods are not ours to delete.
    core.create_namespaced_pod("openforge", restricted_pod("other-forge", {
        "openforge.managed": "1", "openforge.run": "a", "openforge.home": home_label("/elsewhere/.forge")}))
    assert sorted(await asyncio.to_thread(gc_pods, config, "a")) == sorted(b.name for b in boxes[:2])
    def live() -> list[str]:  # gc deletes gracefully: a deleted pod terminates for a moment
        return sorted(n for (_, n), p in double.pods.items() if "deletionTimestamp" not in p.obj["metadata"])

    assert live() == sorted([boxes[2].name, "someone-else", "other-forge"])
    assert await asyncio.to_thread(gc_pods, config) == [boxes[2].name]
    assert live() == ["other-forge", "someone-else"]
    for b in boxes:
        await b.stop()  # already gone: no error
    core.api_client.close()


async def test_cluster_version(double: KubeDouble, tmp_path: Path) -> None:
    assert await asyncio.to_thread(cluster_version, make_config(double, tmp_path)) == f"v1.31.4 at {double.url}"


async def test_active_deadline_ends_the_pod_with_the_reason(double: KubeDouble, tmp_path: Path) -> None:
    # The backend's minimum deadline is a minute; a hand-made pod shows the double and pod_state agree.
    from kubernetes import watch
    from kubernetes.client import ApiClient, CoreV1Api

    from openforge.sandbox.kubernetes import load_client_configuration, pod_state

    config = make_config(double, tmp_path)
    core = CoreV1Api(ApiClient(load_client_configuration(config)))
    core.create_namespaced_pod("openforge", restricted_pod("short", restartPolicy="Never", activeDeadlineSeconds=1))
    seen = []
    events = watch.Watch().stream(core.list_namespaced_pod, "openforge", field_selector="metadata.name=short",
                                  timeout_seconds=5)
    with contextlib.closing(events):
        for event in events:
            seen.append(pod_state(event["object"]))
            if seen[-1][0] == "failed":
                break
    assert ("running", "") in seen
    assert seen[-1] == ("failed", "phase Failed: DeadlineExceeded Pod was active on the node longer than the "
                                  "specified deadline")
    core.api_client.close()


async def test_a_host_venv_can_be_shared_into_pods(tmp_path: Path) -> None:
    # What a rollout test needs: the harness's Python (with the openai SDK) inside the pod, and the
    # proxy on the host's loopback reachable (pods of the double share the host network).
    import sys

    d = KubeDouble(tmp_path / "pods", ro_binds=tuple(sorted({sys.prefix, sys.base_prefix})))
    d.start()
    try:
        async with KubernetesSandbox(make_config(d, tmp_path), run_id="r", rollout_id="ro-py") as sb:
            r = await sb.exec([sys.executable, "-c", "import openai, socket; print(openai.__name__)"], timeout=30)
            assert (r.exit_code, r.stdout) == (0, "openai\n"), r.stderr
    finally:
        d.stop()
