"""A Harbor task's own part of its record (TaskSpec.family, kind "harbor"): its tests, or its steps."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from openforge.rollouts.tasks.harbor.steps import HarborSteps
from openforge.rollouts.tasks.harbor.verifier import HarborTests
from openforge.rollouts.tasks.payload import FamilyPayload


class HarborPayload(FamilyPayload):
    """A Harbor / Terminal-Bench task: its tests run after the agent is gone, or its [[steps]]."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["harbor"] = "harbor"
    tests: HarborTests | None = Field(None, description=(
        "the task's tests: copied in after the agent is gone, test.sh run, its reward file read "
        "(rollouts/tasks/harbor/verifier.py)"))
    steps: HarborSteps | None = Field(None, description=(
        "a multi-step task's [[steps]]: each step's instruction run by the harness in the same sandbox, its tests "
        "after it, min_reward gating the next (rollouts/tasks/harbor/steps.py, rollouts/runner/steps.py)"))

    @model_validator(mode="after")
    def _graded(self) -> HarborPayload:
        if self.tests is None and self.steps is None:
            raise ValueError("a Harbor task has tests or steps")
        return self

    @property
    def exact_graded(self) -> bool:
        return True
