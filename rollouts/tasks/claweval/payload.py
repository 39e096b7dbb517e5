"""An imported ClawEval task's own part of its record (TaskSpec.family, kind "claweval")."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from openforge.rollouts.tasks.claweval.grading import ClawEvalGrading
from openforge.rollouts.tasks.payload import FamilyPayload


class ClawEvalPayload(FamilyPayload):
    """A ClawEval task: its own grader.py, run on the host after the agent is gone on the trace forge recorded."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["claweval"] = "claweval"
    grading: ClawEvalGrading = Field(description=(
        "its task score is the reward (or, with reward = \"judge\", reported beside forge's judge's) "
        "(rollouts/tasks/claweval/grading.py)"))

    @property
    def exact_graded(self) -> bool:
        return False  # as before the payload: its grader.py is the family's, not one of forge's exact graders
