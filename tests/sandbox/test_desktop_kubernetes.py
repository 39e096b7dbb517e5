"""Desktop tasks on the Kubernetes backend: the xedit task of tests/rollouts/tasks/desktop/test_desktop_tasks.py through the real
runner in pods of the API double (tests/k8s_double: restricted pods as bubblewrap'd process trees over the
host's /usr, so the host's xedit, Xvfb and xdotool are the image's; each pod a network namespace, so its
X display is its own). The start script opens the editor on the pod's display (gui.py, written into the
pod), the agent types and saves through it, and OSWorld's metric grades the file after every process of
the pod's exec is gone. A desktop's display asks the image for no browser."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.desktop import EDITOR_TASK, GUI, SAVE, SAVED, TEXT, WORDS, _import, needs_desktop
from tests.helpers.kubernetes import _gui_config, _rollouts, needs_pods, pods, relay_port  # noqa: F401 - fixtures

from openforge.store import Store


@needs_pods
@needs_desktop
async def test_the_editor_on_a_pods_display_is_how_the_task_is_done(pods, relay_port: int,  # noqa: F811
                                                                     store: Store, tmp_path: Path) -> None:
    task = _import(tmp_path, EDITOR_TASK)[0]
    config = _gui_config(pods, tmp_path, relay_port)
    scripts = {"typed": f"{GUI} click {TEXT} && {GUI} type '{WORDS}' && {GUI} click {SAVE} && {SAVED}",
               "unsaved": f"{GUI} click {TEXT} && {GUI} type '{WORDS}' && sleep 1"}
    got = {}
    for label, script in scripts.items():
        (ro,) = await _rollouts(store, config, [task], {task.id: script})
        got[label] = (ro.status, ro.reward, f"{ro.error}\n{ro.verifier_output}\n{(ro.stderr or '')[-1500:]}")
    assert {k: v[:2] for k, v in got.items()} == {"typed": ("scored", 1.0), "unsaved": ("scored", 0.0)}, got
    assert "exact_match: 1" in got["typed"][2]
