"""The desktop family as a task kind (rollouts/tasks/kinds.py): an X display with the task's applications
started on it (rollouts/tasks/desktop/task.py), probed in the sandbox before the agent."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from openforge.rollouts.tasks.desktop.payload import DesktopPayload
from openforge.rollouts.tasks.desktop.task import DesktopTask
from openforge.rollouts.tasks.kinds import TaskKindBase

if TYPE_CHECKING:
    from openforge.rollouts.tasks.format import TaskSpec
    from openforge.sandbox.base import Sandbox


class DesktopKind(TaskKindBase):
    name = "desktop"
    payload_model = DesktopPayload

    def desktop(self, task: TaskSpec) -> DesktopTask | None:
        """The task's display and applications (an extending family keeps them in its own payload)."""
        payload = task.payload(DesktopPayload)
        return payload.desktop if payload is not None else None

    def describe(self, task: TaskSpec) -> str:
        return "desktop"

    def open_site(self, task: TaskSpec) -> Any:
        from openforge.rollouts.tasks.desktop.task import Desktop

        desktop = self.desktop(task)
        return Desktop(desktop) if desktop is not None else None

    async def prepare(self, sb: Sandbox, task: TaskSpec, site: Any) -> None:
        """A display or an application the sandbox lacks: never the policy's 0."""
        from openforge.rollouts.runner.grader import InfraFailure, tail

        if site is None:
            return
        probe = await sb.exec(site.probe_command(), timeout=60)
        if probe.exit_code != 0:
            raise InfraFailure(f"desktop task {task.id} cannot start: {tail(probe.stderr, 300).strip()}")
