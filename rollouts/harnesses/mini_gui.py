"""The built-in `mini-gui` harness: the spec specs/mini-gui.toml says how it runs (mini_gui_agent.py, a compact
computer-use agent: screenshot -> one Chat Completions call with the image -> one action -> xdotool, copied
into the sandbox and run with a python that has Pillow: the local backend's is this venv's interpreter,
containers' the image's `python3`, the browser image has python3-pil); this hook says what this machine
needs for it and reads its result. The sandbox provides the X display (`DISPLAY`) the agent sees and acts
in; docs/gui.md ("Harnesses") documents the action format and the coordinate mapping.

The outcome is read from the agent's own result file (.forge/mini_gui_result.json), never from its
output: `done` is the answer; an API error, an unusable display or a missing result is a harness
failure (never graded); the step limit reached without `done` is the policy's doing, graded with an
empty answer (a state-graded task is graded by the state it left; an answer task fails).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

from openforge.rollouts.harnesses.base import HarnessOutcome, last_line, read_text
from openforge.rollouts.harnesses.spec_harness import SpecHarness
from openforge.sandbox.base import ExecResult, Sandbox

RESULT_PATH = ".forge/mini_gui_result.json"  # mini_gui_agent.RESULT_FILE (the spec's answer.path)


def mini_gui_outcome(result: ExecResult, record_text: str | None) -> HarnessOutcome:
    """The agent's verdict from its result record (and exit code)."""
    try:
        record = json.loads(record_text) if record_text else None
    except ValueError:
        record = None
    if not isinstance(record, dict) or not isinstance(record.get("status"), str):
        why = last_line(result.stderr) or last_line(result.stdout) or "no output"
        return HarnessOutcome.failed(f"mini-gui exited {result.exit_code} without its result: {why}")
    status, steps = record["status"], record.get("steps") if isinstance(record.get("steps"), int) else None
    if result.exit_code != 0 or status not in ("done", "step_limit"):
        error = record.get("error") or last_line(result.stderr) or f"exit code {result.exit_code}"
        return HarnessOutcome.failed(f"mini-gui {status}: {error}", turns=steps)
    if status == "step_limit":
        return HarnessOutcome(answer="", turns=steps)
    answer = record.get("answer")
    if not isinstance(answer, str):
        return HarnessOutcome.failed("mini-gui reported done without an answer string", turns=steps)
    return HarnessOutcome(answer=answer, turns=steps)


class MiniGuiHarness(SpecHarness):
    """The hook specs/mini-gui.toml names: Pillow and xdotool on this machine, its result record."""

    @classmethod
    def missing(cls, cache: Path) -> str | None:
        if importlib.util.find_spec("PIL") is None:
            return f"the mini-gui harness needs Pillow in {sys.executable}: pip install pillow"
        return None if shutil.which("xdotool") else "the mini-gui harness needs xdotool: apt-get install xdotool"

    async def outcome(self, result: ExecResult, sandbox: Sandbox) -> HarnessOutcome:
        return mini_gui_outcome(result, await read_text(sandbox, RESULT_PATH))
