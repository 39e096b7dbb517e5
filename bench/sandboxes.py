"""Sandbox overhead: create -> exec(`true`) -> destroy latency per backend, against the bare primitive
each backend is built on, measured in the same run:

    local (plain, bwrap)  vs  a bare subprocess running `true`
    local bwrap           vs  a bare `bwrap --ro-bind / / ... true`
    docker                vs  `docker run --rm IMG true` (the CLI; the SDK's containers.run if no CLI)

p50 and p99 over the repeats; the ratio is backend p50 / primitive p50. A backend that cannot run
here (no bwrap, no Docker engine) is reported as skipped with the reason.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.timing import time_calls

from openforge.config import DockerSandboxConfig, LocalSandboxConfig, SandboxConfig
from openforge.sandbox import make_sandbox
from openforge.sandbox.local import bwrap_usable
from openforge.sandbox.testing import docker_image


async def _bare(argv: list[str]) -> None:
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.DEVNULL)
    if await proc.wait() != 0:
        raise RuntimeError(f"{argv[0]} failed")


def _sandbox_cycle(config: SandboxConfig) -> Callable[[], Awaitable[None]]:
    counter = iter(range(10**9))

    async def cycle() -> None:
        async with make_sandbox(config, run_id="run-bench", rollout_id=f"ro-bench-{next(counter)}") as sb:
            res = await sb.exec(["true"], timeout=30)
            if res.exit_code != 0:
                raise RuntimeError(f"true failed in {sb.info.backend}: {res.stderr}")

    return cycle


def _docker_run(image: str) -> Callable[[], Awaitable[None]]:
    cli = shutil.which("docker")
    if cli:
        return lambda: _bare([cli, "run", "--rm", "--network", "host", image, "true"])
    from openforge.sandbox.docker_engine import connect

    client = connect()

    async def sdk_run() -> None:
        await asyncio.to_thread(client.containers.run, image, ["true"], remove=True, network_mode="host")

    return sdk_run


async def _measure(quick: bool) -> dict:
    n_local, n_docker = (5, 3) if quick else (40, 15)
    out: dict[str, dict] = {}
    plain = LocalSandboxConfig(isolation="none")
    out["subprocess_true"] = await time_calls(lambda: _bare(["true"]), n_local)
    out["local_plain"] = await time_calls(_sandbox_cycle(plain), n_local)
    bwrap = bwrap_usable()
    if bwrap:
        out["bwrap_true"] = await time_calls(lambda: _bare([bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc",
                                                       "/proc", "--unshare-pid", "true"]), n_local)
        isolated = LocalSandboxConfig(isolation="bwrap")
        out["local_bwrap"] = await time_calls(_sandbox_cycle(isolated), n_local)
    else:
        out["local_bwrap"] = {"skipped": "bubblewrap missing or unusable"}
    image, why = docker_image("busybox")
    if image:
        out["docker_run_rm_true"] = await time_calls(_docker_run(image), n_docker)
        cfg = DockerSandboxConfig(image=image)
        out["docker"] = await time_calls(_sandbox_cycle(cfg), n_docker)
    else:
        out["docker"] = {"skipped": why}
    return out


def run(quick: bool = False) -> dict:
    # Sandboxes go to a throwaway data dir, not the user's FORGE_HOME.
    with tempfile.TemporaryDirectory(prefix="forge-bench-") as tmp:
        old = os.environ.get("FORGE_HOME")
        os.environ["FORGE_HOME"] = str(Path(tmp))
        try:
            res = asyncio.run(_measure(quick))
        finally:
            if old is None:
                os.environ.pop("FORGE_HOME", None)
            else:
                os.environ["FORGE_HOME"] = old
    pairs = [("local_plain", "subprocess_true"), ("local_bwrap", "subprocess_true"),
             ("local_bwrap", "bwrap_true"), ("docker", "docker_run_rm_true")]
    ratios = {f"{a}_vs_{b}": round(res[a]["p50_ms"] / res[b]["p50_ms"], 2)
              for a, b in pairs if "p50_ms" in res.get(a, {}) and "p50_ms" in res.get(b, {})}
    print("create -> exec(true) -> destroy, milliseconds:")
    for name, fig in res.items():
        shown = f"p50 {fig['p50_ms']:8.2f}  p99 {fig['p99_ms']:8.2f}  (n={fig['n']})" if "p50_ms" in fig \
            else f"skipped: {fig['skipped']}"
        print(f"  {name:20s} {shown}")
    for name, ratio in ratios.items():
        print(f"  ratio {name}: {ratio:.2f}x")
    return {**res, "ratios_p50": ratios}


if __name__ == "__main__":
    run(quick=True)
