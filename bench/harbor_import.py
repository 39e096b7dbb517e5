"""`forge tasks import harbor` and `forge tasks validate --run` on a public Harbor / Terminal-Bench dataset.

On request (`HARBOR_SRC=PATH python -m bench harbor_import`; Docker at DOCKER_HOST): PATH is a folder of
Harbor task folders, HARBOR_LABEL names it in the results (repository@commit). Figures:

1. The import as it is (no `--base`): task folders read, imported (of them: built into an image, needing
   none), refused by their reason (base image not on this machine, a step that failed offline, a heredoc,
   multi-step, ...), and the imported tasks that declare `[environment]` limits.
2. The same import with every base mapped to forge's own sandbox image (HARBOR_MAP_TO, default
   `openforge-sandbox:latest`, `forge sandbox build-image`): which Dockerfiles build offline on a
   generic local base, and which steps fail there.
3. `validate --run` over the tasks of (2) with a reference solution (tasks with an image on the Docker
   backend, the others on it too: a Terminal-Bench test.sh expects its image's tools): the wall time;
   references that scored full marks; tasks that credited a hostile answer or the forged reward (must
   be none); attempts that ended as infrastructure failures.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import time
from collections import Counter
from pathlib import Path

from bench.selfcheck_rig import validate_run

_KINDS = [("base image not on this machine", r".*is not on this machine"),
          ("a step runs a command the base lacks", r".*failed in forge's offline build: a command it runs is not in"),
          ("a step failed offline (no network)", r".*failed in forge's offline build \(no network\)"),
          ("a step failed offline (other)", r".*failed in forge's offline build"),
          ("heredoc in the Dockerfile (BuildKit syntax)", r".*is a heredoc"),
          ("multi-step task", r"^multi-step"),
          ("a step forge cannot run yet", r"^step '"),
          ("the engine refused the Dockerfile", r".*the engine refused it"),
          ("malformed task.toml", r"^(bad )?task\.toml"),
          ("tests/test.sh missing", r"^tests/test\.sh")]


def _kind(reason: str) -> str:
    return next((name for name, pattern in _KINDS if re.match(pattern, reason)), "other")


def _import(src: Path, bases: dict[str, str]) -> tuple[dict, list[dict]]:
    from openforge.rollouts.tasks.harbor.image import import_harbor

    t0 = time.perf_counter()
    report = import_harbor(src, bases=bases)
    wall = time.perf_counter() - t0
    images = sum(1 for r in report.tasks if r.get("image"))
    counts = {"task folders": len(report.tasks) + len(report.refused), "imported": len(report.tasks),
              "imported, built into an image (or found by its hash)": images,
              "imported, no image needed": len(report.tasks) - images, "refused": len(report.refused),
              "imported with [environment] limits": sum(1 for r in report.tasks if r.get("limits")),
              "imported, multi-step ([[steps]])": sum(1 for r in report.tasks if r["family"].get("steps")),
              "imported, tests download at grading time (flagged)": len(report.notes),
              "wall_s": round(wall, 1)}
    refused = dict(Counter(_kind(why) for _, why in report.refused).most_common())
    print(f"  {counts}\n  refused by reason: {refused}")
    return {"counts": counts, "refused by reason": refused,
            "refused": {tid: why[:240] for tid, why in report.refused}}, report.tasks


def run(quick: bool = False) -> dict:
    src = os.environ.get("HARBOR_SRC")
    if not src:
        raise RuntimeError("set HARBOR_SRC to a folder of Harbor task folders (a Terminal-Bench / Harbor dataset)")
    root = Path(src)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()[:16]
    local = os.environ.get("HARBOR_MAP_TO", "openforge-sandbox:latest")
    froms = sorted({line.split()[1] for p in root.glob("*/environment/Dockerfile")
                    for line in p.read_text("utf-8", "replace").splitlines()
                    if line.upper().startswith("FROM ") and len(line.split()) > 1})
    print(f"Harbor import of {src}, as it is:")
    as_is, _ = _import(root, {})
    print(f"every base ({len(froms)}) mapped to {local}:")
    mapped, records = _import(root, {name: local for name in froms})
    results = {"source": os.environ.get("HARBOR_LABEL", src), "files_sha256": digest, "as it is": as_is,
               f"every base mapped to {local}": mapped}
    results["validate --run (docker)"] = asyncio.run(_validate(records))
    print(f"validate --run: {results['validate --run (docker)']}")
    return results


async def _validate(records: list[dict]) -> dict:
    from openforge.config import ForgeConfig

    tasks, wall, by_task = await validate_run(records, ForgeConfig.model_validate({"sandbox": {"type": "docker"}}))
    with_solution = [t for t in tasks if t.solution]
    return {"tasks": len(tasks), "wall_s": round(wall, 1), "with a reference solution": len(with_solution),
            "reference scored full marks": sorted(t.id for t in with_solution if not any(
                m.startswith(("solved attempt", "the reference solution")) for m in by_task.get(t.id, []))),
            "credited a hostile answer or the forged reward": sorted(
                tid for tid, msgs in by_task.items() if any(m.startswith("gives credit") for m in msgs)),
            "infrastructure failures": sorted(tid for tid, msgs in by_task.items()
                                              if any("attempt ended failed" in m for m in msgs)),
            "problems (first line each)": {tid: msgs[0][:300] for tid, msgs in sorted(by_task.items())}}
