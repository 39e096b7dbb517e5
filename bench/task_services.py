"""Task services and the ClawEval import (rollouts/tasks/services.py, rollouts/tasks/claweval/importer.py).

1. Per-rollout overhead of a task's services: the same stand-in agent (`true`) through RolloutRunner on a
   local sandbox, a task with one service (tests/data/services/mail_server.py, health-checked and reset,
   its recording front up, stopped after grading) against the same task without it (the baseline,
   measured in the same run). Reported as seconds per rollout and their ratio.
2. The ClawEval import, when CLAWEVAL_SRC names a claw-eval checkout (github:claw-eval/claw-eval): the
   counts (imported, online-only, unsupported), and "runnable offline": imported tasks whose every mock
   service starts and answers its health check and reset here (ServiceSession.open), with the wall time.

    CLAWEVAL_SRC=/path/to/claw-eval python -m bench task_services [--quick]
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "tests" / "data" / "services" / "mail_server.py"


async def _rollouts(tasks: list[Any], n: int) -> float:
    from openforge.config import ForgeConfig
    from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
    from openforge.rollouts.tasks.selfcheck import _StandInHarness
    from openforge.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["FORGE_HOME"] = tmp
        store = Store(Path(tmp) / "forge.db")
        config = ForgeConfig()
        config.runner.concurrency = 1
        runner = RolloutRunner(store, config=config, proxy_url="http://127.0.0.1:9",
                               harness=_StandInHarness({t.id: "true" for t in tasks}))
        run = store.create_run(kind="check", name="bench")
        t0 = time.perf_counter()
        out = await runner.run(run.id, [RolloutSpec(t, i) for t in tasks for i in range(n)])
        wall = time.perf_counter() - t0
        bad = [r for r in out if r.status != "scored"]
        if bad:
            raise RuntimeError(f"{len(bad)} rollout(s) not scored: {bad[0].error}")
        return wall / len(out)


def _overhead(n: int) -> dict[str, Any]:
    from openforge.rollouts.tasks.format import TaskSpec

    service = {"name": "mail", "command": "python mail_server.py", "files": {"mail_server.py": SERVER.read_text()},
               "health": {"method": "GET", "path": "/health"}, "reset": {"method": "POST", "path": "/reset"}}
    plain = TaskSpec(id="plain", instruction="do nothing", verifier="true")
    served = TaskSpec.model_validate({"id": "served", "instruction": "do nothing", "verifier": "true",
                                      "services": [service],
                                      "expect_requests": [{"service": "mail", "path": "/delete", "absent": True}]})
    base = asyncio.run(_rollouts([plain], n))
    with_services = asyncio.run(_rollouts([served], n))
    return {"rollouts": n, "plain_s": round(base, 3), "with_service_s": round(with_services, 3),
            "ratio": round(with_services / base, 2)}


def _claweval(src: str, quick: bool) -> dict[str, Any]:
    from openforge.rollouts.tasks.claweval.importer import import_claweval
    from openforge.rollouts.tasks.services import ServiceSession, ServiceSpec, ServiceStartFailed

    t0 = time.perf_counter()
    report = import_claweval(src)
    import_s = time.perf_counter() - t0
    tasks = report.tasks[:5] if quick else report.tasks
    runnable, failures, starts = 0, [], []
    for record in tasks:
        specs = [ServiceSpec.model_validate(s) for s in record["services"]]
        t1 = time.perf_counter()
        try:
            ServiceSession.open(specs, seed=f"{record['id']}/0").close()
        except ServiceStartFailed as exc:
            failures.append(f"{record['id']}: {exc}"[:200])
            continue
        starts.append(time.perf_counter() - t1)
        runnable += 1
    for line in failures:
        print("  not runnable:", line)
    return {"tasks": len(report.tasks) + len(report.online_only) + len(report.unsupported),
            "imported": len(report.tasks), "online_only": len(report.online_only),
            "unsupported": len(report.unsupported), "checked": len(tasks), "runnable_offline": runnable,
            "import_s": round(import_s, 2),
            "services_start_median_s": round(statistics.median(starts), 2) if starts else None}


def run(quick: bool = False) -> dict[str, Any]:
    result: dict[str, Any] = {"overhead": _overhead(3 if quick else 10)}
    o = result["overhead"]
    print(f"per rollout: {o['plain_s']} s without services, {o['with_service_s']} s with one ({o['ratio']}x)")
    if src := os.environ.get("CLAWEVAL_SRC"):
        result["claweval"] = c = _claweval(src, quick)
        print(f"claweval: {c['tasks']} tasks: {c['imported']} imported ({c['runnable_offline']} of "
              f"{c['checked']} checked start offline here), {c['online_only']} online-only, "
              f"{c['unsupported']} unsupported; import {c['import_s']} s, services start median "
              f"{c['services_start_median_s']} s")
    return result


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run("--quick" in sys.argv), indent=1))
