"""Kubernetes backend overhead: what the backend and the API protocol add on top of the pod itself.

No cluster runs here, so both sides use the API double's pod realisation (tests/k8s_double: a
bubblewrap container, execs entering it with nsenter), measured in the same run:

    cycle: KubernetesSandbox create -> watch Running -> probe exec -> exec(`true`) -> delete, over REST,
           watch and the exec WebSocket   vs   the same container started, `true` run in it, killed
    exec:  sb.exec(["true"]) on a running pod (WebSocket, sh wrapper, timeout, reaping)
           vs   a bare `nsenter ... true` into the same container

p50 and p99 over the repeats; the ratio is backend p50 / primitive p50. On a real cluster the pod
start (scheduling, image, runtime) dominates and is not measured here (its SLO: p99 <= 5 s).

    scale: N rollouts at once (200; 40 with --quick), each start -> 3 execs (one a 1 s "agent") ->
           write + read a file -> kill_all -> stop: API requests per rollout by kind (from the double's
           request log), the shared watch count, the controller's peak thread count, wall time.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from bench.timing import time_calls
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent


def _ratio(backend: dict, primitive: dict) -> float:
    return round(backend["p50_ms"] / max(primitive["p50_ms"], 1e-6), 2)


async def _measure(quick: bool, tmp: Path) -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    from k8s_double import KubeDouble
    from k8s_double.pods import kill_processes, spawn_exec, start_container

    from openforge.config import KubernetesSandboxConfig
    from openforge.sandbox.kubernetes import KubernetesSandbox

    n = 5 if quick else 30
    double = KubeDouble(tmp / "pods", step_s=0.0)
    double.start()
    try:
        config = KubernetesSandboxConfig(kubeconfig=str(double.write_kubeconfig(tmp / "kubeconfig")),
                                         image="openforge:test")
        counter = iter(range(10**9))

        async def backend_cycle() -> None:
            async with KubernetesSandbox(config, run_id="run-bench", rollout_id=f"ro-{next(counter)}") as sb:
                if (await sb.exec(["true"], timeout=30)).exit_code != 0:
                    raise RuntimeError("true failed in the pod")

        async def run_true(pod) -> None:  # type: ignore[no-untyped-def]
            proc = await spawn_exec(pod, ["true"], stdin=False)
            await proc.communicate()
            pod.procs.discard(proc)

        async def primitive_cycle() -> None:
            pod = SimpleNamespace(root=tmp / "bare" / str(next(counter)), name="bare", procs=set(), ns_pid=0)
            await start_container(pod, "/workspace", ["sleep", "3600"])
            await run_true(pod)
            await kill_processes(pod)

        cycle = {"backend": await time_calls(backend_cycle, n), "primitive": await time_calls(primitive_cycle, n)}
        cycle["ratio"] = _ratio(cycle["backend"], cycle["primitive"])

        bare_pod = SimpleNamespace(root=tmp / "bare" / "exec", name="bare", procs=set(), ns_pid=0)
        await start_container(bare_pod, "/workspace", ["sleep", "3600"])
        async with KubernetesSandbox(config, run_id="run-bench", rollout_id="ro-exec") as sb:
            async def backend_exec() -> None:
                await sb.exec(["true"], timeout=30)

            execs = {"backend": await time_calls(backend_exec, n * 2),
                     "primitive": await time_calls(lambda: run_true(bare_pod), n * 2)}
        await kill_processes(bare_pod)
        execs["ratio"] = _ratio(execs["backend"], execs["primitive"])
        return {"create_exec_destroy": cycle, "exec_true": execs}
    finally:
        double.stop()


async def _scale(n: int, tmp: Path) -> dict:
    import threading
    import time

    from k8s_double import KubeDouble

    from openforge.config import KubernetesSandboxConfig
    from openforge.sandbox.kubernetes import KubernetesSandbox

    double = KubeDouble(tmp / "scale-pods", step_s=0.0)
    double.start()
    # The backend's threads (its executor and its one watch) apart from the double's own, which runs
    # in this process too and would not be in a controller.
    peak, sampling = [0], True

    def sample() -> None:
        while sampling:
            peak.append(sum(t.name.startswith("forge-k8s") for t in threading.enumerate()))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        config = KubernetesSandboxConfig(kubeconfig=str(double.write_kubeconfig(tmp / "kubeconfig")),
                                         image="openforge:test", start_timeout_s=120, max_threads=2 * n,
                                         max_pods_per_minute=6000)
        starts: list[float] = []

        async def rollout(i: int) -> None:
            t0 = time.monotonic()
            async with KubernetesSandbox(config, run_id="run-scale", rollout_id=f"ro-{i}") as sb:
                starts.append(time.monotonic() - t0)
                await sb.exec(["true"], timeout=60)
                await sb.exec("sleep 1; echo agent", timeout=60)
                await sb.write_file("answer.txt", b"42")
                assert await sb.read_file("answer.txt") == b"42"
                await sb.kill_all()
                await sb.exec(["true"], timeout=60)

        before = len(double.requests)
        t0 = time.monotonic()
        await asyncio.gather(*(rollout(i) for i in range(n)))
        wall = time.monotonic() - t0
        kinds: dict[str, int] = {}
        for method, path, query in double.requests[before:]:
            kind = ("watch" if query.get("watch") == "true" else "exec" if path.endswith("/exec")
                    else {"POST": "create", "DELETE": "delete", "GET": "get/list"}.get(method, method))
            kinds[kind] = kinds.get(kind, 0) + 1
        starts.sort()
        return {"rollouts": n, "wall_s": round(wall, 1), "requests_per_rollout": round(sum(kinds.values()) / n, 2),
                "requests_by_kind": kinds, "watches": kinds.get("watch", 0), "peak_backend_threads": max(peak),
                "start_p50_s": round(starts[len(starts) // 2], 2), "start_p99_s": round(starts[int(len(starts) * .99) - 1], 2)}
    finally:
        sampling = False
        double.stop()


def run(quick: bool = False) -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    from k8s_double import bwrap_available

    if not bwrap_available():
        out = {"skipped": "the API double needs bubblewrap and nsenter as root"}
        print(f"k8s_sandbox: skipped ({out['skipped']})")
        return out
    with tempfile.TemporaryDirectory() as tmp:
        out = asyncio.run(_measure(quick, Path(tmp)))
        scale = asyncio.run(_scale(40 if quick else 200, Path(tmp)))
    print(f"{'scale':>20}: {scale['rollouts']} rollouts at once in {scale['wall_s']} s | "
          f"{scale['requests_per_rollout']} API requests per rollout {scale['requests_by_kind']} | "
          f"{scale['watches']} watch(es) | peak backend threads {scale['peak_backend_threads']} | start p50 "
          f"{scale['start_p50_s']} s p99 {scale['start_p99_s']} s")
    for name, figures in out.items():
        b, p = figures["backend"], figures["primitive"]
        print(f"{name:>20}: backend p50 {b['p50_ms']:.1f} ms  p99 {b['p99_ms']:.1f} ms | primitive p50 "
              f"{p['p50_ms']:.1f} ms  p99 {p['p99_ms']:.1f} ms | ratio {figures['ratio']:.2f}x")
    return {**out, "scale": scale}


if __name__ == "__main__":
    run(quick="--quick" in sys.argv)
