"""`forge tasks import osworld` and `forge tasks validate --run` on OSWorld's evaluation_examples.

On request (`OSWORLD_SRC=PATH python -m bench osworld_import`): PATH is an OSWorld checkout (or its
evaluation_examples/examples); OSWORLD_LABEL names it in the results (repository@commit), OSWORLD_CACHE
an OSWorld cache folder of local copies, if any. Figures:

1. The import's counts: tasks read, imported, those whose applications (and root, a D-Bus session for
   gsettings) this machine has, online-only, unsupported, and the unsupported by their first reason (a metric, a
   getter, a config step, a postconfig step, a command driving the GUI, a Windows task, malformed).
   A postconfig that saves on the display after the agent (rollouts/tasks/osworld/finish.py) is the
   desktop's finish script: the imported tasks with one, and those online-only for their downloads alone
   with one (they import given OSWORLD_CACHE's local copies), are counted apart.
2. `validate --run` over the imported tasks in the local sandbox: the wall time; **runnable here**: the
   tasks whose reference (an infeasible task's FAIL) scored its marks here, the only ones a correct agent
   is shown to pass on this machine (an import cannot tell: a setting lost without D-Bus, a missing service); tasks with no reference; tasks that credited a
   hostile answer or the planted files (must be none; an idle agent passing shows up here); tasks whose
   attempts failed as infrastructure (their setup needs root or an application this machine lacks).

These are OSWorld-format tasks run by forge, never an OSWorld score.
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

_KINDS = [("metric", r"^metric "), ("getter", r"^(getter |cache_file )"), ("postconfig step", r"^postconfig step"),
          ("postconfig on the display, not mapped", r"^(postconfig drives|pyautogui|the pyautogui script|"
                                                    r"activate_window|close_window|a postconfig (command|step's output))"),
          ("command driving the GUI", r"^a command drives the GUI"), ("config step", r"^config step"),
          ("Windows task", r"^a Windows task"), ("path outside the home folder", r"^path "),
          ("malformed", r"^malformed"), ("duplicate id", r"^duplicate id")]


def _kind(reason: str) -> str:
    return next((name for name, pattern in _KINDS if re.match(pattern, reason)), "other")


def run(quick: bool = False) -> dict:
    src = os.environ.get("OSWORLD_SRC")
    if not src:
        raise RuntimeError("set OSWORLD_SRC to an OSWorld checkout (github.com/xlang-ai/OSWorld)")
    from openforge.rollouts.tasks.osworld.importer import _task_files, import_osworld

    files = _task_files(Path(src))
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:16]
    t0 = time.perf_counter()
    report = import_osworld(src, cache=os.environ.get("OSWORLD_CACHE"))
    import_s = time.perf_counter() - t0
    total = len(report.tasks) + len(report.online_only) + len(report.unsupported)
    counts = {"tasks read": total, "imported": len(report.tasks),
              "imported, what they need installed here": len(report.tasks) - len(report.not_here),
              "imported, not runnable here": len(report.not_here), "online-only": len(report.online_only),
              "unsupported": len(report.unsupported), "GUI-only setup steps skipped (noted)": len(report.notes),
              "imported with a save step after the agent (finish)": sum(
                  1 for t in report.tasks if (t["family"].get("desktop") or {}).get("finish")),
              "online-only for downloads alone, with a mapped save step": _online_with_finish(files, report)}
    unsupported = dict(Counter(_kind(why) for _, why in report.unsupported).most_common())
    metrics = Counter(name for _, why in report.unsupported if _kind(why) == "metric"
                      for name in re.match(r"metric (.*?) is not supported", why).group(1).split(", "))
    print(f"OSWorld-format import of {src}: {counts}; unsupported by first reason: {unsupported}")
    results = {"source": os.environ.get("OSWORLD_LABEL", src), "task_files_sha256": digest, "import_s": round(import_s, 2),
               "import": counts, "unsupported by first reason": unsupported,
               "metrics of those refused for a metric (top 10)": dict(metrics.most_common(10))}
    results["validate --run"] = asyncio.run(_validate(report.tasks))
    print(f"validate --run: {results['validate --run']}")
    return results


def _online_with_finish(files: list[Path], report) -> int:  # type: ignore[no-untyped-def]
    """Tasks online-only for their downloads alone whose postconfig drives the display (the mapping took
    every step of it: a step it refuses makes the task unsupported): given local copies, they import."""
    import json

    from openforge.rollouts.tasks.osworld.finish import drives_gui

    online = {tid for tid, why in report.online_only if all("has no local copy" in r for r in why.split("; "))}
    raws = [json.loads(f.read_text(encoding="utf-8")) for f in files if "windows" not in (p.lower() for p in f.parts)]
    return len({r["id"] for r in raws if isinstance(r, dict) and r.get("id") in online
                and isinstance(r.get("evaluator"), dict)
                and any(drives_gui(step) for step in r["evaluator"].get("postconfig") or [])})


def runnable_here(tasks: list, by_task: dict[str, list[str]]) -> list[str]:  # type: ignore[type-arg]
    """The tasks a correct agent is shown to pass here: those whose reference scored its marks in `validate
    --run` (by_task: task id -> its problems). No reference, no count: an import alone cannot tell."""
    return [t.id for t in tasks if t.solution and not any(
        m.startswith(("solved attempt", "the reference solution")) for m in by_task.get(t.id, []))]


async def _validate(records: list[dict]) -> dict:
    tasks, wall, by_task = await validate_run(records)
    with_solution = [t for t in tasks if t.solution]
    infra = {tid for tid, msgs in by_task.items() if any("attempt ended failed" in m for m in msgs)}
    return {"tasks": len(tasks), "wall_s": round(wall, 1), "with a reference (infeasible: FAIL)": len(with_solution),
            "runnable here (a reference scored its marks here)": len(runnable_here(tasks, by_task)),
            "no reference": sum(1 for t in tasks if not t.solution),
            "credited a hostile answer or planted files": sorted(
                tid for tid, msgs in by_task.items() if any(m.startswith("gives credit") for m in msgs)),
            "infrastructure failures (setup: root or an application missing here)": len(infra)}
