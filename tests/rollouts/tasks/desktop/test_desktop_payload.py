"""rollouts/tasks/desktop/payload.py: a desktop task's own part of its record grades nothing itself (its graders
are the task's core ones) and takes no key it does not know."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from openforge.rollouts.tasks.desktop.payload import DesktopPayload
from openforge.rollouts.tasks.format import TaskSpec

DESKTOP = {"kind": "desktop", "desktop": {"apps": ["xedit"], "start": "xedit note.txt &"}}


def test_a_desktop_task_needs_a_grader_of_its_own() -> None:
    payload = DesktopPayload.model_validate(DESKTOP)
    assert payload.exact_graded is False and payload.desktop.apps == ["xedit"]
    with pytest.raises(ValidationError, match="verifier: missing"):  # the payload alone grades nothing
        TaskSpec.model_validate({"id": "d", "instruction": "edit", "family": DESKTOP})
    task = TaskSpec.model_validate({"id": "d", "instruction": "edit", "verifier": "test -s note.txt", "family": DESKTOP})
    assert isinstance(task.family, DesktopPayload) and task.exact_graded


def test_an_unknown_key_is_refused_and_the_payload_is_frozen() -> None:
    with pytest.raises(ValidationError, match="extra"):
        DesktopPayload.model_validate({**DESKTOP, "display": ":1"})
    payload = DesktopPayload.model_validate(DESKTOP)
    with pytest.raises(ValidationError):
        payload.kind = "web"  # type: ignore[misc]
