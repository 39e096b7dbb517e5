"""The built-in `mini-gui` harness: a compact computer-use agent (mini_gui_agent.py: screenshot -> one
Chat Completions call with the image -> one action -> xdotool) copied into the sandbox and run with a
python that has Pillow (local backend: this venv's interpreter; containers: the image's `python3`,
the browser image has python3-pil). The sandbox provides the X display (`DISPLAY`) the agent sees and
acts in; docs/gui.md ("Harnesses") documents the action format and the coordinate mapping.

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

from openforge.config import ForgeConfig
from openforge.rollouts.harnesses.base import HarnessOutcome, last_line, read_text
from openforge.rollouts.harnesses.mini import MiniHarness
from openforge.sandbox.base import ExecResult, Sandbox

AGENT_SOURCE = Path(__file__).with_name("mini_gui_agent.py")
AGENT_PATH = ".forge/mini_gui_agent.py"  # relative to the sandbox's working directory
RESULT_PATH = ".forge/mini_gui_result.json"  # mini_gui_agent.RESULT_FILE


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


class MiniGuiHarness(MiniHarness):
    name = "mini-gui"
    gui = True  # it sends screenshots: the policy must see images
    agent_source = AGENT_SOURCE
    agent_path = AGENT_PATH
    turns_flag = "--max-steps"

    @classmethod
    def available(cls, config: ForgeConfig) -> str | None:
        if importlib.util.find_spec("PIL") is None:
            return f"the mini-gui harness needs Pillow in {sys.executable}: pip install pillow"
        return None if shutil.which("xdotool") else "the mini-gui harness needs xdotool: apt-get install xdotool"

    async def outcome(self, result: ExecResult, sandbox: Sandbox) -> HarnessOutcome:
        return mini_gui_outcome(result, await read_text(sandbox, RESULT_PATH))
