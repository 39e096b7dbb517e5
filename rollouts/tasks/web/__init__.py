"""Web and desktop (GUI) tasks: the sites of `builtin-web` (sites.py), served per rollout on the host
(server.py), and the `gui` part of a task (spec.py). See docs/gui.md ("Tasks")."""

from pathlib import Path

WEB_TASKS_DIR = Path(__file__).parent / "tasks"  # the `builtin-web` task set
