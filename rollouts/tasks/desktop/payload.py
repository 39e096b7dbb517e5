"""A desktop task's own part of its record (TaskSpec.family, kind "desktop")."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from openforge.rollouts.tasks.desktop.task import DesktopTask
from openforge.rollouts.tasks.payload import FamilyPayload


class DesktopPayload(FamilyPayload):
    """A desktop task: its sandbox starts an X display with no browser, runs `desktop.start` on it (the task's
    applications) and then the agent (rollouts/tasks/desktop/task.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["desktop"] = "desktop"
    desktop: DesktopTask

    @property
    def exact_graded(self) -> bool:
        return False  # its graders are the task's core ones (answer, files, verifier)
