"""Desktop tasks made here (xedit on a file), their import, and the skip when the desktop tools are absent."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from openforge.rollouts.tasks.format import TaskSpec
from openforge.rollouts.tasks.osworld.importer import import_osworld
from openforge.sandbox.local import bwrap_usable
from tests.helpers.required import requires


def _missing() -> str | None:
    tools = [n for n in ("xedit", "Xvfb", "xdotool", "xkbcomp") if shutil.which(n) is None]
    tools += [] if bwrap_usable() else ["bwrap"]
    if tools:
        return f"needs {', '.join(tools)} (apt-get install x11-apps xvfb xdotool x11-xkb-utils bubblewrap)"
    try:
        from openforge.rollouts.tasks.osworld.metric import load_metric
        load_metric("exact_match")
    except Exception as exc:  # noqa: BLE001 - the reason is the skip message
        return f"OSWorld's metrics: {exc}"
    return None


needs_desktop = requires("desktop", _missing())

WORDS = "made on the desktop"


EDITOR_TASK = {
    "id": "xedit-note", "instruction": f"In the editor, write '{WORDS}' in /home/user/note.txt and save it.",
    "config": [{"type": "launch", "parameters": {"command": ["xedit", "/home/user/note.txt"]}},
               {"type": "sleep", "parameters": {"seconds": 0}}],
    "evaluator": {"func": "exact_match",
                  "result": {"type": "vm_command_line", "command": "cat /home/user/note.txt", "shell": True},
                  "expected": {"type": "rule", "rules": {"expected": WORDS}}}}


GUI = '"$FORGE_PYTHON" -I "$FORGE_GUI"'


# With no window manager xedit sits at the screen's top left (591x440 at 1024x768, its default font): its
# Save button at (55, 10), its text below y = 110. What a GUI agent does: click into the text, type, click
# Save; then (a script's patience, not a check) wait until the editor has written the file.
TEXT, SAVE = "300 250", "55 10"


SAVED = "i=0; while [ ! -s note.txt ] && [ $i -lt 150 ]; do sleep 0.2; i=$((i+1)); done"


def _import(tmp_path: Path, *tasks: dict) -> list[TaskSpec]:
    folder = tmp_path / "evaluation_examples" / "examples" / "os"
    folder.mkdir(parents=True, exist_ok=True)
    for raw in tasks:
        (folder / f"{raw['id']}.json").write_text(json.dumps(raw))
    report = import_osworld(tmp_path)
    assert report.unsupported == [] and report.online_only == []
    return [TaskSpec.model_validate(t) for t in report.tasks]
