"""OSWorld's save step after the agent (rollouts/tasks/osworld/finish.py): a postconfig that activates the
document's window and presses the save keys becomes the desktop task's finish script, which gui.py's launcher
runs on the display after the harness exits by itself and before the display ends.

The application is xedit (x11-apps, what CI installs for the desktop tests): it saves on Ctrl-X Ctrl-S (its
app-defaults, /etc/X11/app-defaults/Xedit), so the task's postconfig is OSWorld's own shape with those keys:
activate_window, `python -c "import pyautogui; pyautogui.hotkey('ctrl', 'x'); pyautogui.hotkey('ctrl', 's')"`,
sleep; graded with vm_file + compare_text_file against the expected file."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.config import ForgeConfig
from openforge.rollouts.tasks.format import TaskSpec
from openforge.rollouts.tasks.osworld.finish import NotMapped, pyautogui_lines
from openforge.rollouts.tasks.osworld.payload import OSWorldPayload
from openforge.rollouts.tasks.selfcheck import _StandInHarness
from openforge.sandbox.local import GUI_MODULE
from openforge.store import Store
from tests.helpers.osworld import SAVE_TASK, _import
from tests.helpers.desktop import GUI, TEXT, WORDS, needs_desktop


def _osworld(task: TaskSpec) -> OSWorldPayload:
    """The task's OSWorld part: its evaluator and its desktop."""
    payload = task.payload(OSWorldPayload)
    assert payload is not None
    return payload


def _post(*steps: dict) -> dict:
    return {**SAVE_TASK, "id": f"t{zlib.crc32(json.dumps(steps).encode())}",
            "evaluator": {**SAVE_TASK["evaluator"], "postconfig": list(steps)}}


def test_a_save_postconfig_becomes_the_desktops_finish_script(tmp_path: Path) -> None:
    report = _import(tmp_path, SAVE_TASK)
    assert report.unsupported == [] and report.online_only == []
    task = TaskSpec.model_validate(report.tasks[0])
    osworld = _osworld(task)
    assert osworld.evaluator.postconfig == []  # nothing left for the grader to drive
    assert osworld.desktop is not None and osworld.desktop.apps == ["xedit", "xdotool"] and "needs:xdotool" in task.tags
    finish = osworld.desktop.finish or ""
    steps = finish.split('export OSW_HOME="$PWD"\n', 1)[1]
    assert steps == ("(\nforge_window --name '^xedit$' xedit\n) || forge_status=$?\n"
                     "(\nxdotool key Control_L+x\n) || forge_status=$?\n"
                     "(\nxdotool key Control_L+s\n) || forge_status=$?\n"
                     "(\nsleep 0.5\n) || forge_status=$?\n(\nsleep 0.5\n) || forge_status=$?\n"
                     'exit "$forge_status"')


def test_the_pyautogui_calls_osworld_uses_map_to_xdotool() -> None:
    assert pyautogui_lines('import pyautogui; pyautogui.hotkey(["shift", "ctrl", "e"]); pyautogui.press(["enter"]);'
                           'pyautogui.write("berry_mirror"); pyautogui.press("esc"); '
                           'pyautogui.typewrite(["down", "F2"])'
                           ) == ["xdotool key Shift_L+Control_L+e", "xdotool key Return",
                                 "xdotool type -- berry_mirror", "xdotool key Escape", "xdotool key Down F2"]
    for code, why in [("import pyautogui; pyautogui.click(10, 10)", "pyautogui.click is not mapped"),
                      ("import pyautogui, os; pyautogui.press('enter')", "does more than call"),
                      ("import pyautogui; pyautogui.press('enter', presses=3)", "presses= is not mapped"),
                      ("import pyautogui; pyautogui.write('a\\nb')", "plain printable text"),
                      ("import pyautogui; pyautogui.press('volumemute')", "'volumemute' is not mapped"),
                      ("import pyautogui; k = 's'; pyautogui.hotkey('ctrl', k)", "does more than call")]:
        with pytest.raises(NotMapped, match=why):
            pyautogui_lines(code)


def test_a_postconfig_forge_cannot_drive_stays_refused_with_its_reason(tmp_path: Path) -> None:
    save = SAVE_TASK["evaluator"]["postconfig"][1]
    click = _post({"type": "execute",
                   "parameters": {"command": ["python", "-c", "import pyautogui; pyautogui.click(5, 5)"]}})
    by_class = _post({"type": "activate_window", "parameters": {"window_name": "Mail.thunderbird", "by_class": True}},
                     save)
    no_desktop = {**_post(save), "id": "no-desktop", "config": []}
    shell_gui = _post({"type": "execute", "parameters": {"command": "wmctrl -c xedit", "shell": True}})
    report = _import(tmp_path, click, by_class, no_desktop, shell_gui)
    assert report.tasks == [] and report.online_only == []
    assert dict(report.unsupported) == {
        click["id"]: "pyautogui.click is not mapped (hotkey, press, write, typewrite and time.sleep are)",
        by_class["id"]: "activate_window by_class on instance.class 'Mail.thunderbird' is mapped only strict (one "
                        "instance, one class)",
        "no-desktop": "postconfig drives an application after the agent, but the task starts none on a desktop "
                      "(no launch or open step)",
        shell_gui["id"]: "a postconfig command drives the GUI other than with a `python -c` pyautogui script"}
    # shell lines beside the save keys run in the finish script too; without save keys they stay the grader's
    zipped = _post(*SAVE_TASK["evaluator"]["postconfig"], {"type": "execute", "parameters": {
        "command": ["/bin/bash", "-c", "cd /home/user && zip -qr n.zip note.txt"]}})
    plain = _post({"type": "execute", "parameters": {"command": "chmod +x eval.sh", "shell": True}})
    got = {t["id"]: t for t in _import(tmp_path / "2", zipped, plain).tasks}
    zipped_finish = got[zipped["id"]]["family"]["desktop"]["finish"]
    assert "(\n/bin/bash -c 'cd '\"$OSW_HOME\"' && zip -qr n.zip note.txt'\n)" in zipped_finish
    assert got[plain["id"]]["family"]["evaluator"]["postconfig"] == ["chmod +x eval.sh"]
    assert "finish" not in got[plain["id"]]["family"]["desktop"]


def _configured(name: str, *steps: dict) -> dict:
    """A task whose config launches two editors, the first with the instance name Mail (WM_CLASS "Mail",
    "Xedit"; the other's "xedit", "Xedit"), then runs `steps`."""
    return {"id": name, "instruction": "Answer FAIL.", "evaluator": {"func": "infeasible"}, "config": [
        {"type": "launch", "parameters": {"command": ["xedit", "-name", "Mail", "/home/user/a.txt"]}},
        {"type": "launch", "parameters": {"command": ["xedit", "/home/user/b.txt"]}}, *steps]}


def _activate(name: str, **flags: bool) -> dict:
    return {"type": "activate_window", "parameters": {"window_name": name, **flags}}


def test_display_steps_after_the_launch_join_the_start_script(tmp_path: Path) -> None:
    """OSWorld's activate_window and pyautogui keys in a task's config after its launch are start-script lines,
    mapped as the finish script's are; before any launch, or a mapping that does not exist, they stay refused."""
    keys = {"type": "execute", "parameters": {"command": ["python", "-c", "import pyautogui; import time; "
                                                          "pyautogui.hotkey('alt', 'f10'); time.sleep(0.5);"]}}
    click = {"type": "execute", "parameters": {"command": ["python", "-c", "import pyautogui; pyautogui.click(5, 5)"]}}
    tasks = [_configured("mapped", _activate("Mail.Xedit", strict=True, by_class=True), keys, click),
             _configured("loose", _activate("Mail.Xedit", by_class=True)),
             {**_configured("first", keys), "config": [_activate("xedit"), *_configured("first")["config"]]}]
    report = _import(tmp_path, *tasks)
    assert dict(report.unsupported) == {
        "loose": "config step activate_window by_class on instance.class 'Mail.Xedit' is mapped only strict (one "
                 "instance, one class)",
        "first": "config step activate_window is not supported"}
    [task] = [TaskSpec.model_validate(t) for t in report.tasks]
    desktop = _osworld(task).desktop
    assert desktop is not None and desktop.apps == ["xedit", "xdotool"] and "needs:xdotool" in task.tags
    prelude, steps = desktop.start.split("forge_wait=20\n")
    assert prelude.count("forge_window() {") == 1 and desktop.finish is None
    assert steps.splitlines()[2:] == ["forge_window --classname '^Mail$' '' '^Xedit$' || true",
                                      "xdotool key Alt_L+F10 || true", "sleep 0.5 || true"]
    assert report.notes == [("mapped", "skipped a setup step that only drives the GUI: python -c 'import pyautogui; "
                                       "pyautogui.click(5, 5)'")]  # a click, as before the launch


@needs_desktop
def test_the_start_script_activates_the_window_its_config_names(tmp_path: Path) -> None:
    """gui.py run --start with the imported start script: the command starts with the focus on the window of
    the instance.class named (wmctrl -x's "Mail.Xedit" or "xedit.Xedit"), whichever editor mapped first."""
    tasks = [_configured("mail", _activate("Mail.Xedit", strict=True, by_class=True)),
             _configured("plain", _activate("xedit.Xedit", strict=True, by_class=True))]
    report = _import(tmp_path, *tasks)
    focus = 'f=$(xdotool getwindowfocus); m=$(xdotool search --classname "^Mail$"); [ "$f" = "$m" ] && echo Mail ' \
            '|| xdotool getwindowname "$f"'
    for task, focused in zip(report.tasks, ["Mail", "xedit"]):
        start = task["family"]["desktop"]["start"]
        done = subprocess.run([sys.executable, "-I", str(GUI_MODULE), "run", "--start", start, "--",
                               "sh", "-c", focus], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert (done.returncode, done.stdout.strip()) == (0, focused), done.stderr


def test_close_window_maps_as_activate_window_does(tmp_path: Path) -> None:
    """OSWorld's close_window (its server's `wmctrl -c`, `-x` by_class, `-F` strict) finds its window as
    activate_window does, in the finish script (Thunderbird's postconfig: close it so it writes its prefs)
    and in the start script after a launch; before any launch it stays refused."""
    close = {"type": "close_window", "parameters": {"window_name": "Mail.Xedit", "strict": True, "by_class": True}}
    post = _post(close, {"type": "sleep", "parameters": {"seconds": 0.5}})
    first = {**_configured("first"), "config": [close, *_configured("first")["config"]]}
    loose = _configured("loose", {"type": "close_window", "parameters": {"window_name": "Mail.Xedit", "by_class": True}})
    report = _import(tmp_path, post, _configured("started", close, _activate("xedit")), first, loose)
    assert dict(report.unsupported) == {
        "first": "config step close_window is not supported",
        "loose": "config step close_window by_class on instance.class 'Mail.Xedit' is mapped only strict (one "
                 "instance, one class)"}
    got = {t["id"]: TaskSpec.model_validate(t) for t in report.tasks}
    finish = _osworld(got[post["id"]]).desktop.finish or ""  # type: ignore[union-attr]
    assert finish.split('export OSW_HOME="$PWD"\n', 1)[1] == (
        "(\nforge_close --classname '^Mail$' '' '^Xedit$'\n) || forge_status=$?\n(\nsleep 0.5\n) || forge_status=$?\n"
        'exit "$forge_status"')
    start = _osworld(got["started"]).desktop.start  # type: ignore[union-attr]
    assert start.split("forge_wait=20\n")[1].splitlines()[2:] == [
        "forge_close --classname '^Mail$' '' '^Xedit$' || true", "forge_window --name xedit || true"]


@needs_desktop
def test_close_window_closes_only_the_window_it_names(tmp_path: Path) -> None:
    """gui.py run --start with an imported config that launches two editors and closes one by instance.class:
    the editor Mail (WM_DELETE_WINDOW: an unmodified xedit quits) is gone, the other still shows; a name no
    window has closes nothing; Mail with words typed in stays open, as xedit answers a close (not a kill) with
    unsaved changes, under OSWorld's window manager as here."""
    close = {"type": "close_window", "parameters": {"window_name": "Mail.Xedit", "strict": True, "by_class": True}}
    nothing = {"type": "close_window", "parameters": {"window_name": "Nobody.Xedit", "strict": True, "by_class": True}}
    typed = {"type": "execute", "parameters": {"command": ["python", "-c", "import pyautogui; pyautogui.write('hi')"]}}
    report = _import(tmp_path, _configured("close", close), _configured("none", nothing),
                     _configured("modified", _activate("Mail.Xedit", strict=True, by_class=True), typed, close))
    # the command lists the editors' instances ("close": once the closed editor's window is gone, up to 20 s)
    gone = 'for i in $(seq 40); do [ -z "$(xdotool search --onlyvisible --classname "^Mail$")" ] && break; sleep 0.5; done; '
    count = 'for n in Mail xedit; do printf "%s=%s " $n $(xdotool search --onlyvisible --classname "^$n$" | wc -l); done'
    shown = {}
    for task in report.tasks:
        start = task["family"]["desktop"]["start"].replace("forge_wait=20", "forge_wait=2")  # the absent window's wait
        done = subprocess.run([sys.executable, "-I", str(GUI_MODULE), "run", "--start", start, "--", "sh", "-c",
                               {"close": gone, "modified": "sleep 1; "}.get(task["id"], "") + count], cwd=tmp_path,
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr
        shown[task["id"]] = done.stdout.strip()
    assert shown == {"close": "Mail=0 xedit=1", "none": "Mail=1 xedit=1", "modified": "Mail=1 xedit=1"}


async def _run(store: Store, task: TaskSpec, scripts: dict[str, str]) -> dict[str, tuple]:
    run = store.create_run(kind="check", name=f"finish-{task.id}")
    got = {}
    for label, script in scripts.items():
        runner = RolloutRunner(store, config=ForgeConfig(), proxy_url="http://127.0.0.1:9",
                               harness=_StandInHarness({task.id: script}, {}))
        (ro,) = await runner.run(run.id, [RolloutSpec(task)])
        got[label] = (ro.status, ro.reward, ro.failure_kind, f"{ro.error}\n{ro.stderr}\n{ro.verifier_output}")
    return got


@needs_desktop
async def test_the_finish_saves_what_the_agent_left_open(store: Store, tmp_path: Path) -> None:
    task = TaskSpec.model_validate(_import(tmp_path, SAVE_TASK).tasks[0])
    typed = f"{GUI} click {TEXT} && {GUI} type"
    got = await _run(store, task, {
        # the words typed, never saved by the agent: the finish's Ctrl-X Ctrl-S saves them
        "typed": f"{typed} '{WORDS}'",
        "other words": f"{typed} 'made in a shell'",
        "idle": "true",
        # the words typed, then the editor closed unsaved: the finish finds no window; the file is what it is
        "closed": f"{typed} '{WORDS}' && xdotool windowkill $(xdotool search --onlyvisible --class xedit)",
        # the words typed, then the harness exits 3: the finish still saves, the exit code stays the harness's
        "failed": f"{typed} '{WORDS}'; exit 3"})
    assert {k: v[:3] for k, v in got.items()} == {
        "typed": ("scored", 1.0, None), "other words": ("scored", 0.0, None), "idle": ("scored", 0.0, None),
        "closed": ("scored", 0.0, None), "failed": ("failed", None, "harness")}, got
    assert "compare_text_file: 1" in got["typed"][3]
    assert "gui.py run: the desktop's finish script exited 1: no window matches ^xedit$" in got["closed"][3]
    assert got["failed"][3].startswith("harness: solution exited 3"), got["failed"][3]


@needs_desktop
def test_the_launcher_runs_the_finish_only_after_a_harness_that_exited_by_itself(tmp_path: Path) -> None:
    """gui.py run --finish directly: its environment is the launcher's (MARK, set by the command, is not
    seen), its failure is one stderr line and the exit code stays the command's; after a TERM to the launcher
    (the sandbox ending a timed-out exec) or a command killed by a signal the finish does not run. (Through
    the runner a timed-out rollout is timed_out with 0.0 before any grading: runner.py.)"""
    def launch(finish: str, command: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-I", str(GUI_MODULE), "run", "--finish", finish, "--", "sh", "-c",
                                 command], cwd=tmp_path, stderr=subprocess.PIPE, text=True)

    mark = 'echo "display=$DISPLAY mark=$MARK" > finished'
    done = launch(mark, "export MARK=agent; exit 5")
    assert done.wait(timeout=60) == 5
    assert re.fullmatch(r"display=:\d+ mark=\n", (tmp_path / "finished").read_text())
    (tmp_path / "finished").unlink()
    failing = launch("echo no window matches xedit >&2; exit 2", "exit 0")
    assert failing.wait(timeout=60) == 0
    assert "gui.py run: the desktop's finish script exited 2: no window matches xedit" in failing.stderr.read()
    killed = launch(mark, "kill -KILL $$")
    assert killed.wait(timeout=60) == 256 - signal.SIGKILL  # the command killed by a signal: no finish
    stopped = launch(mark, "touch started; exec sleep 60")
    for _ in range(300):
        if (tmp_path / "started").exists():
            break
        time.sleep(0.1)
    stopped.send_signal(signal.SIGTERM)  # what the sandbox sends a timed-out exec's whole tree first
    assert stopped.wait(timeout=60) == 256 - signal.SIGTERM
    assert not (tmp_path / "finished").exists()
    for proc in (done, failing, killed, stopped):
        proc.stderr.close()
