"""What the rollout runner costs per rollout, beyond the agent's own work.

A rollout whose harness and verifier are both `true` is pure overhead: store writes (pending,
running, output, final state), a local sandbox's start and stop, task files, two execs. Baseline:
the same two commands as bare subprocesses. Figures: ms per rollout one at a time (median over
repeats), the ratio to the baseline, and rollouts/s with 4 at a time.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from openforge.rollouts.harnesses.base import HarnessBase


class _TrueHarness(HarnessBase):
    name = "true"
    calls_model = False

    async def prepare(self, sandbox, ctx) -> None:  # noqa: ANN001
        return None

    def command(self, ctx) -> list[str]:  # noqa: ANN001
        return ["true"]

    def env(self, ctx) -> dict[str, str]:  # noqa: ANN001
        return {}

    async def outcome(self, result, sandbox):  # noqa: ANN001, ANN201
        from openforge.rollouts.harnesses.base import HarnessOutcome

        return HarnessOutcome(answer="")


async def _bare(n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        for argv in (["true"], ["sh", "-c", "true"]):
            proc = await asyncio.create_subprocess_exec(*argv)
            await proc.wait()
    return (time.perf_counter() - t0) / n


async def _runner(store, n: int, concurrency: int) -> float:  # noqa: ANN001
    from openforge.config import ForgeConfig
    from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
    from openforge.rollouts.tasks.format import TaskSpec

    cfg = ForgeConfig()
    cfg.runner.concurrency = concurrency
    task = TaskSpec(id="noop", instruction="nothing", files={"a.txt": "x\n"}, verifier="true")
    runner = RolloutRunner(store, config=cfg, proxy_url="http://127.0.0.1:9", harness=_TrueHarness())
    run = store.create_run(kind="eval")
    t0 = time.perf_counter()
    out = await runner.run(run.id, [RolloutSpec(task, i) for i in range(n)])
    elapsed = time.perf_counter() - t0
    assert all(r.status == "scored" for r in out), [r.error for r in out]
    return elapsed / n


def run(quick: bool = False) -> dict:
    from openforge.store import Store

    repeats, n = (3, 4) if quick else (5, 10)
    with tempfile.TemporaryDirectory() as home:
        os.environ["FORGE_HOME"] = home
        store = Store(Path(home) / "forge.db")
        bare = statistics.median(asyncio.run(_bare(n)) for _ in range(repeats))
        serial = statistics.median(asyncio.run(_runner(store, n, 1)) for _ in range(repeats))
        parallel = statistics.median(asyncio.run(_runner(store, n * 2, 4)) for _ in range(repeats))
        store.close()
    result = {
        "bare_two_execs_ms": round(bare * 1000, 2),
        "runner_ms_per_rollout": round(serial * 1000, 2),
        "overhead_ratio_vs_bare": round(serial / bare, 2),
        "runner_rollouts_per_s_c4": round(1 / parallel, 1),
        "speedup_c4_vs_c1": round(serial / parallel, 2),
    }
    print(f"rollouts: bare 2 execs {result['bare_two_execs_ms']} ms; runner {result['runner_ms_per_rollout']} ms "
          f"per rollout ({result['overhead_ratio_vs_bare']}x bare); {result['runner_rollouts_per_s_c4']} rollouts/s "
          f"at concurrency 4 ({result['speedup_c4_vs_c1']}x concurrency 1)")
    return result


if __name__ == "__main__":
    run(quick=True)
