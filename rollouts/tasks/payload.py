"""The base of a task family's own part of a task (`TaskSpec.family`): one model per family, in its folder
(`rollouts/tasks/<kind>/payload.py`), keyed by `kind` as the sandbox config is keyed by `type`. The family's
kind names it (`payload_model`), so a family from another package brings its own (docs/tasks.md, "Adding a
task format")."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class FamilyPayload(BaseModel):
    """A family's part of a task: `kind` (its family's name, a `Literal` in each subclass) and its own fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str

    @property
    def exact_graded(self) -> bool:
        """Whether the payload itself grades the task exactly (a Harbor task's tests, an OSWorld evaluator), so
        the task needs no other grader."""
        return False
