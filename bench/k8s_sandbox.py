"""Kubernetes backend overhead: what the backend and the API protocol add on top of the pod itself.

No cluster runs here, so both sides use the API double's pod realisation (tests/k8s_double: a
bubblewrap container, execs entering it with nsenter), measured in the same run:

    cycle: KubernetesSandbox create -> watch Running -> probe exec -> exec(`true`) -> delete, over REST,
           watch and the exec WebSocket   vs   the same container started, `true` run in it, killed
    exec:  sb.exec(["true"]) on a running pod (WebSocket, sh wrapper, timeout, reaping)
           vs   a bare `nsenter ... true` into the same container

p50 and p99 over the repeats; the ratio is backend p50 / primitive p50. On a real cluster the pod
start (scheduling, image, runtime) dominates and is not measured here (its SLO: p99 <= 5 s).
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

    from openforge.config import SandboxConfig
    from sandbox.kubernetes import KubernetesSandbox

    n = 5 if quick else 30
    double = KubeDouble(tmp / "pods", step_s=0.0)
    double.start()
    try:
        config = SandboxConfig(type="kubernetes", kubernetes={
            "kubeconfig": str(double.write_kubeconfig(tmp / "kubeconfig")), "image": "openforge:test"})
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


def run(quick: bool = False) -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    from k8s_double import bwrap_available

    if not bwrap_available():
        out = {"skipped": "the API double needs bubblewrap and nsenter as root"}
        print(f"k8s_sandbox: skipped ({out['skipped']})")
        return out
    with tempfile.TemporaryDirectory() as tmp:
        out = asyncio.run(_measure(quick, Path(tmp)))
    for name, figures in out.items():
        b, p = figures["backend"], figures["primitive"]
        print(f"{name:>20}: backend p50 {b['p50_ms']:.1f} ms  p99 {b['p99_ms']:.1f} ms | primitive p50 "
              f"{p['p50_ms']:.1f} ms  p99 {p['p99_ms']:.1f} ms | ratio {figures['ratio']:.2f}x")
    return out


if __name__ == "__main__":
    run(quick="--quick" in sys.argv)
