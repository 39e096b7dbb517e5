"""rollouts/tasks/desktop/kind.py: a desktop task's display and applications come from its payload; a task
without one has no desktop to open."""

from __future__ import annotations

from openforge.rollouts.tasks.desktop.kind import DesktopKind
from openforge.rollouts.tasks.format import TaskSpec


def test_the_kind_opens_the_desktop_its_payload_names() -> None:
    task = TaskSpec.model_validate({"id": "d", "instruction": "edit", "verifier": "test -s note.txt", "family": {
        "kind": "desktop", "desktop": {"apps": ["xedit"], "start": "xedit note.txt &"}}})
    kind = DesktopKind()
    assert kind.desktop(task).apps == ["xedit"] and kind.describe(task) == "desktop"
    assert kind.open_site(task) is not None
    plain = TaskSpec.model_validate({"id": "p", "instruction": "say hi", "verifier": "true"})
    assert kind.desktop(plain) is None and kind.open_site(plain) is None
