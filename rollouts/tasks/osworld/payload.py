"""An OSWorld-format task's own part of its record (TaskSpec.family, kind "osworld"): its evaluator and the
desktop it runs on."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from openforge.rollouts.tasks.desktop.task import DesktopTask
from openforge.rollouts.tasks.osworld.evaluator import OSWorldEval
from openforge.rollouts.tasks.payload import FamilyPayload


class OSWorldPayload(FamilyPayload):
    """An OSWorld-format task: a desktop task graded by OSWorld's evaluator."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["osworld"] = "osworld"
    evaluator: OSWorldEval = Field(description=(
        "its getters run in the sandbox after the agent is gone, OSWorld's metric on the host "
        "(rollouts/tasks/osworld/evaluator.py)"))
    desktop: DesktopTask | None = Field(None, description=(
        "the display's applications and start script (rollouts/tasks/desktop/task.py)"))

    @property
    def exact_graded(self) -> bool:
        return True
