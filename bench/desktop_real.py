"""Real desktop applications on the desktop task kind: LibreOffice Calc and VLC, a documented manual check.

On request (`python -m bench desktop_real`; the applications are not in CI: `apt-get install -y
--no-install-recommends libreoffice-calc libreoffice-writer vlc`, about 505 MB on Debian 12). Each part skips
with a line when its application is missing. OSWORLD_SRC (an OSWorld checkout or its examples folder) adds
part 2.

1. One OSWorld-format task made here in OSWorld's own shape for a Calc task (config: `download` of the
   sheet, from a local copy in OSWorld's cache layout, then `open`; postconfig: `activate_window` on
   "sheet.xlsx - LibreOffice Calc" (strict), sleep, `pyautogui.hotkey("ctrl", "s")`, sleep; `compare_table`
   sheet_data against a `cloud_file` expected sheet from the cache), imported with `import_osworld` and run
   through the runner, the local (bubblewrap) sandbox and OSWorld's metric by a scripted agent driving
   LibreOffice through gui.py: click cell B4, type the total, Enter, never save: the finish step saves.
   Also: the wrong total typed, the right total typed and LibreOffice killed before the finish (nothing
   saved it), and an idle agent: each must score 0. One config step stands for the
   state of OSWorld's VM image: a LibreOffice profile with the first-start tip and the "keep current
   format" question turned off (without it ctrl+s on an .xlsx waits on that dialog).
2. The same task and agents in a Docker container (`sandbox.type = "docker"`), on the desktop image built
   here with LibreOffice Calc in it (`forge sandbox build-image --variant desktop --packages
   libreoffice-calc`: debootstrap and apt from the Debian mirror, several minutes the first time, then
   cached). Skips without a Docker engine (DOCKER_HOST) or root (debootstrap).
3. `forge tasks validate --run` (the self-check) over the imported OSWorld tasks that need VLC.

These are OSWorld-format tasks run by forge, never an OSWorld score.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

SHEET_URL = "https://example.invalid/forge-bench/sheet.xlsx"
GOLD_URL = "https://example.invalid/forge-bench/sheet_gold.xlsx"
TASK_ID = "forge-calc-total"
# What OSWorld's VM image has in its LibreOffice profile: no tip dialog at start, no format question on save.
PROFILE = """<?xml version="1.0" encoding="UTF-8"?>
<oor:items xmlns:oor="http://openoffice.org/2001/registry" xmlns:xs="http://www.w3.org/2001/XMLSchema" \
xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
<item oor:path="/org.openoffice.Office.Common/Misc"><prop oor:name="ShowTipOfTheDay" oor:op="fuse">\
<value>false</value></prop></item>
<item oor:path="/org.openoffice.Office.Common/Save/Document"><prop oor:name="WarnAlienFormat" oor:op="fuse">\
<value>false</value></prop></item>
</oor:items>
"""
PROFILE_DIR = "$HOME/.config/libreoffice/4/user"
SAVE = 'import pyautogui; pyautogui.hotkey("ctrl", "s");'
CALC_TASK = {
    "id": TASK_ID, "snapshot": "libreoffice_calc", "source": "forge bench/desktop_real.py",
    "instruction": "In sheet.xlsx, fill in the total of the counts in the row called \"total\" (cell B4).",
    "config": [
        {"type": "execute", "parameters": {"shell": True, "command": (
            f"mkdir -p {PROFILE_DIR} && printf '%s' '{PROFILE}' > {PROFILE_DIR}/registrymodifications.xcu")}},
        {"type": "download", "parameters": {"files": [{"url": SHEET_URL, "path": "/home/user/sheet.xlsx"}]}},
        {"type": "open", "parameters": {"path": "/home/user/sheet.xlsx"}}],
    "related_apps": ["libreoffice_calc"],
    "evaluator": {
        "postconfig": [
            {"type": "activate_window", "parameters": {"window_name": "sheet.xlsx - LibreOffice Calc", "strict": True}},
            {"type": "sleep", "parameters": {"seconds": 0.5}},
            {"type": "execute", "parameters": {"command": ["python", "-c", SAVE]}},
            {"type": "sleep", "parameters": {"seconds": 0.5}}],
        "func": "compare_table",
        "expected": {"type": "cloud_file", "path": GOLD_URL, "dest": "sheet_gold.xlsx"},
        "result": {"type": "vm_file", "path": "/home/user/sheet.xlsx", "dest": "sheet.xlsx"},
        "options": {"rules": [{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0"}]}}}
GUI = '"$FORGE_PYTHON" -I "$FORGE_GUI"'
# LibreOffice 7.4 at 1024x768 with no window manager fills the screen: cell B4 is at (162, 231) under the
# first-run info bar. A GUI agent's moves: wait for the document's window, click the cell, type, Enter.
WAIT = ("i=0; until xdotool search --name '^sheet.xlsx - LibreOffice Calc$' >/dev/null 2>&1 || [ $i -ge 300 ]; "
        "do sleep 0.2; i=$((i+1)); done; sleep 2")
WINDOW = "'^sheet.xlsx - LibreOffice Calc$'"
TYPE = f"{WAIT}; {GUI} click 162 231 && {GUI} type {{}} && {GUI} key Return"
SCRIPTS = {"total typed, not saved (the finish saves)": TYPE.format(7),
           "wrong total typed": TYPE.format(8),
           # the control: the total typed, then LibreOffice killed unsaved: the finish finds no window, nothing saves
           "total typed, LibreOffice killed": TYPE.format(7) + f" && sleep 1; kill -KILL "
                                              f"$(xdotool search --name {WINDOW} getwindowpid); sleep 1",
           "idle": WAIT}
EXPECTED = {"total typed, not saved (the finish saves)": 1.0, "wrong total typed": 0.0,
            "total typed, LibreOffice killed": 0.0, "idle": 0.0}


def _sheet(path: Path, total: int | None) -> None:
    import openpyxl

    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "Sheet1"
    for row in [("item", "count"), ("apples", 3), ("pears", 4), ("total", total)]:
        ws.append(row)
    wb.save(path)


def _cache_name(url: str, path: str) -> str:
    """OSWorld's cache file name for a download: uuid5(url)_basename (rollouts/tasks/osworld/importer.py)."""
    return f"{uuid.uuid5(uuid.NAMESPACE_URL, url)}_{Path(path).name}"


def run(quick: bool = False) -> dict:
    results: dict = {"calc": _calc(), "calc in docker": _calc_docker(), "vlc validate --run": _vlc()}
    print(json.dumps(results, indent=1))
    return results


def _calc_docker() -> dict:
    """Part 2: the desktop image with Calc, the rollouts in its containers."""
    from openforge.errors import ForgeError
    from openforge.sandbox.container_images import ensure_image

    try:
        t0 = time.perf_counter()
        image = ensure_image("desktop", packages=("libreoffice-calc",), timeout=1800)
        built_s = time.perf_counter() - t0
    except ForgeError as exc:
        print(f"desktop_real: no desktop image: {exc}")
        return {"skipped": f"no desktop image: {exc}"}
    out = _calc({"type": "docker", "image": image})
    out["image"] = {"tag": image, "ready_s": round(built_s, 1)}
    return out


def _calc(sandbox: dict | None = None) -> dict:
    """Part 1 (the local bubblewrap sandbox, the host's LibreOffice), or part 2 with `sandbox` settings."""
    if sandbox is None and shutil.which("soffice") is None:
        print("desktop_real: LibreOffice is not installed "
              "(apt-get install -y --no-install-recommends libreoffice-calc)")
        return {"skipped": "LibreOffice (soffice) is not installed"}
    from openforge.rollouts.tasks.format import TaskSpec
    from openforge.rollouts.tasks.osworld.importer import import_osworld
    from openforge.rollouts.tasks.osworld.payload import OSWorldPayload

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folder = root / "src" / "evaluation_examples" / "examples" / "libreoffice_calc"
        folder.mkdir(parents=True)
        (folder / f"{TASK_ID}.json").write_text(json.dumps(CALC_TASK, indent=1))
        cache = root / "cache" / TASK_ID
        cache.mkdir(parents=True)
        _sheet(cache / _cache_name(SHEET_URL, "/home/user/sheet.xlsx"), None)
        _sheet(cache / "sheet_gold.xlsx", 7)
        report = import_osworld(root / "src", cache=root / "cache")
        if report.unsupported or report.online_only:
            return {"import refused": report.unsupported + report.online_only}
        task = TaskSpec.model_validate(report.tasks[0])
        osworld = task.payload(OSWorldPayload)
        desktop = osworld.desktop if osworld is not None else None
        out = {"task": {"apps": desktop.apps if desktop else None, "tags": task.tags}}
        out["rollouts"] = asyncio.run(_rollouts(task, root, sandbox))
        out["all as expected"] = all(r["reward"] == EXPECTED[k] for k, r in out["rollouts"].items())
        return out


async def _rollouts(task, root: Path, sandbox: dict | None) -> dict:  # type: ignore[no-untyped-def]
    from openforge.config import ForgeConfig
    from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
    from openforge.rollouts.tasks.selfcheck import _StandInHarness
    from openforge.store import Store

    os.environ["FORGE_HOME"] = str(root / "home")
    store = Store(root / "home" / "forge.db")
    run = store.create_run(kind="check", name="desktop-real")
    got = {}
    for label, script in SCRIPTS.items():
        config = ForgeConfig.model_validate({"sandbox": sandbox}) if sandbox else ForgeConfig()
        runner = RolloutRunner(store, config=config, proxy_url="http://127.0.0.1:9",
                               harness=_StandInHarness({task.id: script}, {}))
        t0 = time.perf_counter()
        (ro,) = await runner.run(run.id, [RolloutSpec(task)])
        got[label] = {"status": ro.status, "reward": ro.reward, "failure_kind": ro.failure_kind,
                      "wall_s": round(time.perf_counter() - t0, 1),
                      "verifier_output": (ro.verifier_output or "")[-300:],
                      "stderr_tail": (ro.stderr or "")[-300:], "error": ro.error}
        print(f"calc ({config.sandbox.type}) {label}: {got[label]['status']} reward={got[label]['reward']} in {got[label]['wall_s']} s")
    store.close()
    return got


def _vlc() -> dict:
    src = os.environ.get("OSWORLD_SRC")
    if not src:
        return {"skipped": "set OSWORLD_SRC to an OSWorld checkout to run its VLC tasks"}
    if shutil.which("vlc") is None:
        print("desktop_real: VLC is not installed (apt-get install -y --no-install-recommends vlc)")
        return {"skipped": "VLC is not installed"}
    from bench.selfcheck_rig import validate_run
    from openforge.rollouts.tasks.osworld.importer import import_osworld

    records = [t for t in import_osworld(src).tasks if "needs:VLC" in t.get("tags", [])]
    tasks, wall, by_task = asyncio.run(validate_run(records))
    return {"tasks": [t.id for t in tasks], "wall_s": round(wall, 1),
            "references (infeasible: FAIL)": sum(1 for t in tasks if t.solution),
            "problems": {tid: msgs for tid, msgs in by_task.items() if msgs}}
