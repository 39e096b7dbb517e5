"""OSWorld-format task sets written here, their import and a rollout of one, and the skip when the office tools
are absent."""

from __future__ import annotations

import json
from pathlib import Path
import time

from openforge.config import ForgeConfig
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import TaskSpec
from openforge.rollouts.tasks.selfcheck import _StandInHarness
from openforge.store import Store
from tests.helpers.required import requires
from openforge.rollouts.tasks.osworld.importer import import_osworld
from tests.helpers.desktop import WORDS


def _metrics_missing() -> str | None:
    try:
        from openforge.rollouts.tasks.osworld.metric import load_metric
        load_metric("compare_table")
        load_metric("check_include_exclude")
    except Exception as exc:  # noqa: BLE001 - the reason is the skip message
        return str(exc)
    return None


INPUT_URL = "https://drive.google.com/uc?id=input-sheet"


EXPECTED_URL = "https://drive.google.com/uc?id=gold-sheet"


def _task(task_id: str, instruction: str, config: list, evaluator: dict) -> dict:
    return {"id": task_id, "snapshot": "os", "instruction": instruction, "source": "test", "config": config,
            "trajectory": "trajectories/", "related_apps": ["os"], "evaluator": evaluator}


TASKS = {
    "os/shout": _task("shout", "Write the words of ~/in.txt in capitals to /home/user/out.txt.", [
        {"type": "execute", "parameters": {"command": ["python", "-c", "import pyautogui; pyautogui.click(960, 540)"]}},
        {"type": "execute", "parameters": {"command": ["sh", "-c", "printf 'hello world' > /home/user/in.txt"]}},
        {"type": "sleep", "parameters": {"seconds": 0}}],
        {"func": "check_include_exclude",
         "result": {"type": "vm_command_line", "command": "cat ~/out.txt", "shell": True},
         "expected": {"type": "rule", "rules": {"include": ["HELLO WORLD"], "exclude": ["hello"]}}}),
    "libreoffice_calc/total": _task("total", "Add a row TOTAL with the sum of column B to /home/user/sheet.xlsx.", [
        {"type": "download", "parameters": {"files": [{"url": INPUT_URL, "path": "/home/user/sheet.xlsx"}]}},
        {"type": "open", "parameters": {"path": "/home/user/sheet.xlsx"}}],
        {"func": "compare_table", "result": {"type": "vm_file", "path": "/home/user/sheet.xlsx", "dest": "sheet.xlsx"},
         "expected": {"type": "cloud_file", "path": EXPECTED_URL, "dest": "gold.xlsx"},
         "options": {"rules": [{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0"}]}}),
    "gimp/impossible": _task("impossible", "Make this photo into a working car.", [],
                             {"func": "infeasible"}),
    "chrome/tabs": _task("tabs", "Close the second tab.", [
        {"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["https://example.com"]}}],
        {"func": "exact_match", "result": {"type": "rule", "rules": {"expected": "x"}},
         "expected": {"type": "rule", "rules": {"expected": "x"}}}),
    "libreoffice_impress/slides": _task("slides", "Fix the slides.", [],
        {"func": "check_slide_orientation_Portrait", "result": {"type": "vm_file", "path": "/home/user/a.pptx", "dest": "a.pptx"},
         "expected": {"type": "vm_file", "path": "/home/user/b.pptx", "dest": "b.pptx"}}),
    "vlc/playing": _task("playing", "Play the video.", [],
        {"func": "exact_match", "result": {"type": "vlc_playing_info"}, "expected": {"type": "rule", "rules": {}}}),
    "os/saved": _task("saved", "Save the file.", [],
        {"postconfig": [{"type": "activate_window", "parameters": {"window_name": "gedit"}}],
         "func": "exact_match", "result": {"type": "vm_command_line", "command": ["cat", "/home/user/x"]},
         "expected": {"type": "rule", "rules": {"expected": "x"}}}),
}


def _write_set(root: Path) -> Path:
    examples = root / "evaluation_examples" / "examples"
    for name, task in TASKS.items():
        (examples / name).parent.mkdir(parents=True, exist_ok=True)
        (examples / f"{name}.json").write_text(json.dumps(task), encoding="utf-8")
    (examples / "os" / "broken.json").write_text('{"id": "broken", ', encoding="utf-8")
    return root


async def _run(store: Store, task: TaskSpec, scripts: dict[str, str], answers: dict[str, str] | None = None,
               ) -> dict[str, tuple[str, float | None, str]]:
    run = store.create_run(kind="check", name=f"osworld-{task.id}")
    got = {}
    for label, script in scripts.items():
        harness = _StandInHarness({task.id: script}, {task.id: (answers or {})[label]} if label in (answers or {}) else {})
        runner = RolloutRunner(store, config=ForgeConfig(), proxy_url="http://127.0.0.1:9", harness=harness)
        (ro,) = await runner.run(run.id, [RolloutSpec(task)])
        got[label] = (ro.status, ro.reward, f"{ro.error}\n{ro.verifier_output}")
    return got


def _office_missing() -> str | None:
    import importlib.util

    lacking = [m for m in ("desktop_env", "docx", "odf", "pptx", "fitz", "bs4") if importlib.util.find_spec(m) is None]
    return (f"OSWorld's docs.py / slides.py / chrome.py need {', '.join(lacking)} (pip install 'openforge[osworld]')"
            if lacking else None)


needs_office = requires("osworld", _metrics_missing() or _office_missing())


SAVE_KEYS = ("import pyautogui; import time; pyautogui.hotkey('ctrl', 'x'); pyautogui.hotkey('ctrl', 's'); "
             "time.sleep(0.5);")


SAVE_TASK = {
    "id": "xedit-save", "instruction": f"In the editor, write '{WORDS}' in /home/user/note.txt.",
    "config": [{"type": "launch", "parameters": {"command": ["xedit", "/home/user/note.txt"]}}],
    "evaluator": {
        "postconfig": [{"type": "activate_window", "parameters": {"window_name": "xedit", "strict": True}},
                       {"type": "execute", "parameters": {"command": ["python", "-c", SAVE_KEYS]}},
                       {"type": "sleep", "parameters": {"seconds": 0.5}}],
        "func": "compare_text_file",
        "result": {"type": "vm_file", "path": "/home/user/note.txt", "dest": "note.txt"},
        "expected": {"type": "cloud_file", "path": "https://example.invalid/expected.txt", "dest": "expected.txt"}}}


def _import(tmp_path: Path, *tasks: dict):  # type: ignore[no-untyped-def]
    folder = tmp_path / "src" / "evaluation_examples" / "examples" / "os"
    folder.mkdir(parents=True, exist_ok=True)
    for raw in tasks:
        (folder / f"{raw['id']}.json").write_text(json.dumps(raw))
        (tmp_path / "cache" / raw["id"]).mkdir(parents=True, exist_ok=True)
        (tmp_path / "cache" / raw["id"] / "expected.txt").write_text(WORDS)
    return import_osworld(tmp_path / "src", cache=tmp_path / "cache")
