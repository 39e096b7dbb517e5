"""rollouts/tasks/payload.py: a family's part of a task is a closed, frozen model keyed by kind."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import ValidationError

from openforge.rollouts.tasks.payload import FamilyPayload


class _Quiz(FamilyPayload):
    kind: Literal["quiz"] = "quiz"
    answer: int


def test_a_payload_refuses_unknown_fields_and_edits() -> None:
    p = _Quiz(answer=3)
    assert (p.kind, p.answer, p.exact_graded) == ("quiz", 3, False)  # graded by the task's own graders
    with pytest.raises(ValidationError, match="extra"):
        _Quiz(answer=3, answr=4)
    with pytest.raises(ValidationError, match="frozen"):
        p.answer = 4  # type: ignore[misc]
    with pytest.raises(ValidationError):
        _Quiz(kind="other", answer=3)
