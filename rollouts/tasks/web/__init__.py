"""Web and desktop (GUI) tasks: the sites of `builtin-web` (sites.py), served per rollout on the host
(server.py), and the `gui` part of a task (spec.py), held in its `family` payload (payload.py);
WebVoyager / Online-Mind2Web task files imported as online-only tasks (a rollout's browser opens the live
start page: `LivePage`), or mapped onto those sites (benchmarks.py). See docs/gui.md ("Tasks") and
docs/tasks.md ("Web benchmarks")."""

from pathlib import Path

WEB_TASKS_DIR = Path(__file__).parent / "tasks"  # the `builtin-web` task set
