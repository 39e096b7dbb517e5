"""A desktop task: its sandbox gets an X display with no browser and no site, its applications started on it.

A task's `desktop` field (an OSWorld-format task that launches or opens an application, rollouts/tasks/
osworld/importer.py) names the programs it needs and a start script. For each rollout the runner

1. runs the task's `setup` as for any task (no display: files, downloads, shell lines);
2. checks, in the sandbox, that Xvfb and every program in `apps` are on PATH: one missing stops the
   rollout there, an infrastructure failure naming it (`Desktop.probe_command`), never a score;
3. runs the harness inside sandbox/gui.py's launcher with `--start`: Xvfb, then the start script on
   that display (each application started in the background), then the harness once a window shows.
   The applications live in the harness's exec, so they are gone with it: the grader (OSWorld's
   getters and metric) runs after every agent process, the applications included, has ended.
   A task's `finish` script (OSWorld's postconfig that saves the open document,
   rollouts/tasks/osworld/finish.py) runs on the display when the harness has exited by itself, before
   the launcher ends the display: with the launcher's environment, not the agent's, on whatever the agent
   left open. After a timeout or a kill it does not run; when it fails (the agent closed the window) the
   launcher says so on stderr and still exits with the harness's code: the file is what the agent left.
   The start (60 s) and the finish (60 s) have their own time: the launcher keeps the harness's limit
   (`gui.py run --budget`) and reports an overrun by its exit status (rollouts/runner/harness_run.py).

A desktop task is graded by the state its agent leaves (a file, a command's output), as OSWorld grades
it: a harness with a shell of its own reaches that state without the display. mini-gui, which acts only
with click / type / key / scroll, has to go through the applications on the screen.
"""

from __future__ import annotations

import re
import shlex

from pydantic import BaseModel, ConfigDict, Field, field_validator

from openforge.sandbox.gui import GuiSpec

DISPLAY_PROGRAMS = ("Xvfb", "xkbcomp")  # what gui.py's launcher needs in the sandbox for a bare display
_PROGRAM_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")


class DesktopTask(BaseModel):
    """What a desktop task starts on its display before the agent."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    apps: list[str] = Field(min_length=1, description=(
        "the programs the start script runs, each checked on the sandbox's PATH before the agent starts"))
    start: str = Field(min_length=1, description=(
        "a shell script run on the display, in the working directory, after `setup` and before the agent: it "
        "starts the applications in the background (a window must show within 60 s)"))
    finish: str | None = Field(None, description=(
        "a shell script run on the display after the harness exits by itself and before the display ends "
        "(OSWorld's save step: activate the document's window, press ctrl+s); not run after a timeout or a "
        "kill; its failure is logged, never scored (gui.py `run --finish`)"))

    @field_validator("apps")
    @classmethod
    def _programs(cls, value: list[str]) -> list[str]:
        for name in value:
            if not _PROGRAM_RE.match(name):
                raise ValueError(f"{name!r} is not a program name (letters, digits, . _ + -)")
        return value

    @field_validator("start")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value


class Desktop:
    """A desktop task's display for one rollout, where a builtin-web task has its site session: nothing
    served on the host, no socket to bind; the sandbox's launcher starts Xvfb and the start script."""

    socket_path = None  # a container binds no site socket

    def __init__(self, desktop: DesktopTask) -> None:
        self.desktop = desktop

    def gui_spec(self) -> GuiSpec:
        return GuiSpec(url=None, start=self.desktop.start, finish=self.desktop.finish)

    def probe_command(self) -> str:
        """A shell command, run in the sandbox before the agent, that exits non-zero with what is missing on
        stderr when the display or one of the task's applications is not installed there."""
        names = " ".join(shlex.quote(n) for n in dict.fromkeys([*DISPLAY_PROGRAMS, *self.desktop.apps]))
        return (f'missing=""; for p in {names}; do command -v "$p" >/dev/null 2>&1 || missing="$missing $p"; done; '
                '[ -z "$missing" ] || { echo "not installed in the sandbox:$missing" >&2; exit 1; }')

    def close(self) -> None:
        """Nothing to end: the display lives and ends inside the harness's exec."""
