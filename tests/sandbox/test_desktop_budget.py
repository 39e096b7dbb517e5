"""A desktop's start and finish run outside the harness's time limit (sandbox/gui.py `run --budget`,
rollouts/runner/harness_run.py): the harness gets the task's whole limit, the start script and the finish
their own 60 s each, and the launcher, which keeps the harness's limit, is what says it overran: its exit
status, never text the agent could print, and by its own clock, so a launcher the agent held stopped past
the limit still reports the overrun."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from openforge.config import ForgeConfig
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import TaskSpec
from openforge.rollouts.tasks.osworld.payload import OSWorldPayload
from openforge.rollouts.tasks.selfcheck import _StandInHarness
from openforge.sandbox.gui import HARNESS_TIMED_OUT, GuiSpec
from openforge.sandbox.local import GUI_MODULE
from openforge.store import Store
from tests.helpers.osworld import SAVE_TASK, _import
from tests.helpers.desktop import GUI, TEXT, WORDS, needs_desktop

FINISHED = "gui.py run: the command ran past its budget"


def test_what_runs_around_the_command_makes_the_launcher_keep_the_budget() -> None:
    desktop = GuiSpec(start="xedit &", finish="true").keeping(30)
    assert desktop.launcher_args()[-3:] == ["--budget", "30", "--"] and desktop.exec_timeout(30) == 30 + 60 + 60 + 30
    site = GuiSpec(url="http://127.0.0.1:8080/").keeping(30)  # a site's browser starts outside the limit too
    assert site.launcher_args()[-3:] == ["--budget", "30", "--"] and site.exec_timeout(30) == 30 + 60 + 60 + 30
    bare = GuiSpec().keeping(30)  # a harness that starts its own browser on a bare display: all of it is its time
    assert bare.budget is None and "--budget" not in bare.launcher_args() and bare.exec_timeout(30) == 30


def _launch(tmp_path: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-I", str(GUI_MODULE), "run", *args], cwd=tmp_path,
                            stderr=subprocess.PIPE, text=True)


@needs_desktop
def test_the_launcher_keeps_the_commands_budget_from_the_commands_start(tmp_path: Path) -> None:
    finish = "echo saved > finished"
    # a start that takes 3 s does not eat the command's 2 s: it ends in time and gets its finish
    slow_start = _launch(tmp_path, "--start", "sleep 3; xedit &", "--finish", finish, "--budget", "2", "--",
                         "sh", "-c", "sleep 1; exit 7")
    assert slow_start.wait(timeout=120) == 7 and (tmp_path / "finished").exists(), slow_start.stderr.read()
    (tmp_path / "finished").unlink()
    over = _launch(tmp_path, "--finish", finish, "--budget", "1", "--", "sh", "-c", "exec sleep 60")
    assert over.wait(timeout=60) == HARNESS_TIMED_OUT  # ended at its budget, not after its 60 s
    assert FINISHED in over.stderr.read() and not (tmp_path / "finished").exists()
    # the agent stops the launcher (SIGSTOP) so that nobody times its command, which ends past the budget
    held = _launch(tmp_path, "--finish", finish, "--budget", "2", "--", "sh", "-c", "touch started; sleep 4")
    for _ in range(600):
        if (tmp_path / "started").exists():
            break
        time.sleep(0.1)
    held.send_signal(signal.SIGSTOP)
    time.sleep(5)  # the command has ended meanwhile, within no budget
    held.send_signal(signal.SIGCONT)
    assert held.wait(timeout=60) == HARNESS_TIMED_OUT and not (tmp_path / "finished").exists()
    for proc in (slow_start, over, held):
        proc.stderr.close()


@pytest.mark.slow
@needs_desktop
async def test_the_harness_gets_its_whole_limit_and_an_overrun_ends_timed_out(store: Store, tmp_path: Path) -> None:
    """Through the runner, a start that takes 8 s of a 15 s limit: a harness that types the words and ends
    10 s in is graded with its finish (the save), 1.0 (with the start in its limit it was cut at 15 s);
    one still running at 15 s ends timed_out, 0.0, never graded, no finish; one that stops its launcher
    and kills it past the limit (so no report of its time comes) is the policy's failure, never graded."""
    imported = TaskSpec.model_validate(_import(tmp_path, SAVE_TASK).tasks[0])
    payload = imported.payload(OSWorldPayload)
    assert payload is not None and payload.desktop is not None
    desktop = payload.desktop.model_copy(update={"start": "sleep 8\n" + payload.desktop.start})
    typed = f"{GUI} click {TEXT} && {GUI} type '{WORDS}'"
    scripts = {"near": f"{typed} && sleep 8", "over": f"{typed} && sleep 60",
               "held": f"{typed}; L=$PPID; kill -STOP $L; sleep 18; kill -KILL $L; sleep 5"}
    tasks = {name: imported.model_copy(update={"id": name, "time_limit_s": 15,
                                          "family": payload.model_copy(update={"desktop": desktop})})
             for name in scripts}
    run = store.create_run(kind="check", name="desktop-budget")
    runner = RolloutRunner(store, config=ForgeConfig(), proxy_url="http://127.0.0.1:9",
                           harness=_StandInHarness(scripts, {}))
    got = {ro.task_id: ro for ro in await runner.run(run.id, [RolloutSpec(t) for t in tasks.values()])}
    near, over, held = got["near"], got["over"], got["held"]
    assert (near.status, near.reward, near.failure_kind) == ("scored", 1.0, None), (near.error, near.stderr)
    assert "compare_text_file: 1" in (near.verifier_output or "")
    assert (over.status, over.reward, over.failure_kind, over.verifier_output) == ("timed_out", 0.0, "timeout", None)
    assert over.error == "harness ran past its limit of 15s and was killed" and FINISHED in (over.stderr or "")
    assert (held.status, held.reward, held.failure_kind, held.verifier_output) == ("scored", 0.0, "policy", None)
    assert (held.error or "").startswith("policy: the display's launcher was killed by signal 9"), held.error
