"""Desktop tasks (rollouts/tasks/desktop/task.py): an OSWorld-format task made here that launches `xedit` (the X
Toolkit's text editor, Debian's x11-apps) on a file is imported as a desktop task; through the real runner
and a bubblewrap sandbox its start script opens the editor on the sandbox's own display (sandbox/gui.py
--start), the agent acts on it with gui.py's click / type, and OSWorld's metric grades the saved file after
the agent and the editor are gone. A display or an application the sandbox lacks stops the rollout before
the agent: an infrastructure failure, never a score.

(xedit, not xterm, since before issue 31 the sandbox's user was root of its user namespace, where xterm's
initgroups() fails; as `forge` xterm runs too: tests/sandbox/test_sandbox_local_user.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from openforge.config import ForgeConfig, HarnessConfig
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.desktop.task import DesktopTask
from openforge.rollouts.tasks.format import TaskSpec
from openforge.rollouts.tasks.osworld.importer import import_osworld
from openforge.rollouts.tasks.osworld.payload import OSWorldPayload
from openforge.rollouts.tasks.selfcheck import _StandInHarness
from openforge.sandbox.local import bwrap_usable
from openforge.store import Store
from tests.helpers.desktop import EDITOR_TASK, GUI, SAVE, SAVED, TEXT, WORDS, _import, needs_desktop
from tests.helpers.required import skip_or_fail


TYPED = f"{GUI} click {TEXT} && {GUI} type '{WORDS}' && {GUI} click {SAVE} && {SAVED}"


def _desktop(task: TaskSpec) -> DesktopTask | None:
    """An imported task's desktop (its OSWorld payload's)."""
    payload = task.payload(OSWorldPayload)
    assert payload is not None
    return payload.desktop


def test_a_task_that_launches_an_application_is_a_desktop_task(tmp_path: Path) -> None:
    ghost = {**EDITOR_TASK, "id": "ghost", "config": [
        {"type": "execute", "parameters": {"command": ["sh", "-c", "printf x > /home/user/in.txt"]}},
        {"type": "launch", "parameters": {"command": ["no-such-app-here", "--big"]}},
        {"type": "execute", "parameters": {"command": ["sh", "-c", "echo after"]}}]}
    ghost_task, editor = _import(tmp_path, ghost, EDITOR_TASK)
    # the steps before the first launch stay the setup (no display); the launch and what follows it run on it
    assert ghost_task.setup is not None and "in.txt" in ghost_task.setup and "no-such-app" not in ghost_task.setup
    assert _desktop(ghost_task) == DesktopTask(apps=["no-such-app-here"], start='set -e\nexport OSW_HOME="$PWD"\n'
                                             "( no-such-app-here --big >/dev/null 2>&1 & )\nsh -c 'echo after'")
    assert editor.setup is None and _desktop(editor) == DesktopTask(apps=["xedit"], start=(
        'set -e\nexport OSW_HOME="$PWD"\n( xedit "$OSW_HOME"/note.txt >/dev/null 2>&1 & )\nsleep 0'))
    assert "needs:xedit" in editor.tags and "needs:no-such-app-here" in ghost_task.tags
    # not runnable here: only the task whose application this machine lacks
    not_here = dict(import_osworld(tmp_path).not_here)
    assert not_here.pop("ghost") == "needs no-such-app-here on a desktop (not installed here: no-such-app-here)"
    assert list(not_here) == ([] if shutil.which("xedit") else ["xedit-note"])
    with pytest.raises(ValueError, match="desktop: a desktop task has no site"):
        older = {**editor.model_dump(exclude_none=True, exclude={"family"}),  # the form before `family`
                 "desktop": _desktop(editor).model_dump(), "gui": {"site": "colour"}}  # type: ignore[union-attr]
        TaskSpec.model_validate(older)
    with pytest.raises(ValueError, match="is not a program name"):
        DesktopTask(apps=["xedit; rm -rf ~"], start="xedit &")


async def _run(store: Store, task: TaskSpec, scripts: dict[str, str], answers: dict[str, str] | None = None,
               ) -> dict[str, tuple[str, float | None, str | None, str]]:
    run = store.create_run(kind="check", name=f"desktop-{task.id}")
    got = {}
    for label, script in scripts.items():
        answer = {task.id: answers[label]} if answers and label in answers else {}
        runner = RolloutRunner(store, config=ForgeConfig(), proxy_url="http://127.0.0.1:9",
                               harness=_StandInHarness({task.id: script}, answer))
        (ro,) = await runner.run(run.id, [RolloutSpec(task)])
        got[label] = (ro.status, ro.reward, ro.failure_kind, f"{ro.error}\n{ro.verifier_output}")
    return got


async def test_a_missing_application_stops_the_rollout_before_the_agent(store: Store, tmp_path: Path) -> None:
    if not bwrap_usable():
        skip_or_fail("local-bwrap", "needs bubblewrap (the runner's default local sandbox)")
    launch = {"type": "launch", "parameters": {"command": ["no-such-app"]}}
    task = _import(tmp_path, {**EDITOR_TASK, "config": [launch]})[0]
    got = await _run(store, task, {"would pass": f"printf '{WORDS}' > note.txt"})
    status, reward, kind, said = got["would pass"]
    assert (status, reward, kind) == ("failed", None, "infra"), said
    assert "desktop task xedit-note cannot start: not installed in the sandbox:" in said and "no-such-app" in said


@needs_desktop
async def test_the_application_on_the_display_is_how_the_task_is_done(store: Store, tmp_path: Path) -> None:
    task = _import(tmp_path, EDITOR_TASK)[0]
    got = await _run(store, task, {
        "typed": TYPED,
        "idle": "true",
        # the words as the final answer: graded on the file, not the answer
        "answered": "true",
        # typed and never saved: the editor (and its buffer) is gone before the grader reads the file
        "unsaved": f"{GUI} click {TEXT} && {GUI} type '{WORDS}' && sleep 1",
        # other words saved through the editor: OSWorld's exact_match on the file
        "other words": f"{GUI} click {TEXT} && {GUI} type 'made in a shell' && {GUI} click {SAVE} && {SAVED}"},
        answers={"answered": WORDS})
    assert {k: v[:2] for k, v in got.items()} == {
        "typed": ("scored", 1.0), "idle": ("scored", 0.0), "answered": ("scored", 0.0), "unsaved": ("scored", 0.0),
        "other words": ("scored", 0.0)}, got
    assert "exact_match: 1" in got["typed"][3]


@needs_desktop
def test_mini_gui_types_into_the_editor_it_sees(tiny_vl_model: Path, store: Store, tmp_path: Path) -> None:
    """The real mini-gui harness against a scripted model on the tiny Qwen2-VL: click the editor's text in
    the 512x384 screenshot of the 1024x768 screen, type the words, click Save, done; graded 1 on the file."""
    from tests.helpers.gui_fixtures import run_gui_task

    task = _import(tmp_path, EDITOR_TASK)[0]
    actions = ["click(150, 125)", f'type("{WORDS}")', "click(27, 5)", "done()"]  # the text, the words, Save
    ro, _ = run_gui_task(store, tiny_vl_model, actions, task.id,
                         HarnessConfig(name="mini-gui", max_turns=5, max_tokens=32,
                                       extra_args=["--no-tools", "--max-side", "512"]), task=task)
    assert (ro.status, ro.reward, ro.harness) == ("scored", 1.0, "mini-gui"), (ro.error, ro.stdout, ro.stderr)
    calls = store.list_calls(rollout_id=ro.id)
    assert len(calls) == 4 and all(len(c.images) == 1 for c in calls)


@needs_desktop
async def test_a_start_script_that_fails_is_never_scored(store: Store, tmp_path: Path) -> None:
    """The launcher ends the harness's exec before the agent runs (exit 4, its line on stderr): a harness
    failure, masked, though the agent's script would have passed."""
    task = _import(tmp_path, EDITOR_TASK)[0]
    payload = task.payload(OSWorldPayload)
    assert payload is not None
    broken = task.model_copy(update={"family": payload.model_copy(update={
        "desktop": DesktopTask(apps=["xedit"], start="echo no such file >&2; exit 3")})})
    got = await _run(store, broken, {"would pass": f"printf '{WORDS}' > note.txt"})
    status, reward, kind, said = got["would pass"]
    assert (status, reward, kind) == ("failed", None, "harness"), said
    assert "gui.py run: the desktop's start script exited 3: no such file" in said
