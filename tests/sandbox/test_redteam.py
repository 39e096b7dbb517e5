"""Red team: an adversarial policy in an isolated local (bubblewrap) sandbox, run as root, trying to get
reward without doing the task. Each test is one attack through the real runner (or the real sandbox),
and states what must happen instead. docs/security.md lists them with what each found.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from openforge.config import ForgeConfig
from openforge.store import Rollout, Store
from openforge.rollouts.tasks.grading import ExpectedAnswer, answer_matches
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import BUILTIN_DIR, TaskSpec
from openforge.sandbox import make_sandbox
from openforge.sandbox.testing import backend_config
from tests.helpers.redteam import Agent

pytestmark = pytest.mark.timeout(90)


def _bwrap_config(**local: object):  # type: ignore[no-untyped-def]
    cfg, why = backend_config("local-bwrap", **local)
    if cfg is None:
        pytest.skip(why)
    return cfg


async def _attack(store: Store, script: str, task: TaskSpec, env: dict[str, str] | None = None,
                  **sandbox: object) -> Rollout:
    cfg = ForgeConfig()
    cfg.sandbox = _bwrap_config(**sandbox)
    cfg.runner.verifier_timeout_s = 20
    runner = RolloutRunner(store, config=cfg, proxy_url="http://127.0.0.1:9", harness=Agent(script, env))
    run = store.create_run()
    [ro] = await runner.run(run.id, [RolloutSpec(task)])
    return ro


# -- files the grader reads out of the sandbox ----------------------------------------------------

SPECIAL_FILES = {
    "fifo": "mkfifo out.txt",  # an open() of it blocks until a writer comes: none ever will
    "socket": "python3 -I -c \"import socket; socket.socket(socket.AF_UNIX).bind('out.txt')\"",
}


@pytest.mark.parametrize("kind", sorted(SPECIAL_FILES))
async def test_a_fifo_or_socket_where_a_file_is_expected_is_wrong_not_a_hang(store: Store, kind: str) -> None:
    task = TaskSpec(id="t", instruction="write 4 to out.txt", expect_files={"out.txt": "4\n"})
    started = time.monotonic()
    ro = await asyncio.wait_for(_attack(store, SPECIAL_FILES[kind], task), 60)
    assert ro.status == "scored" and ro.reward == 0.0, (ro.status, ro.error)
    assert "out.txt: wrong" in (ro.verifier_output or "") or "out.txt: missing" in (ro.verifier_output or "")
    assert time.monotonic() - started < 30


async def test_a_fifo_as_the_answer_file_is_no_answer(store: Store) -> None:
    task = TaskSpec(id="t", instruction="say 4", expect_answer={"number": 4})
    ro = await asyncio.wait_for(_attack(store, "mkdir -p .forge && mkfifo .forge/answer.txt", task), 60)
    assert ro.status == "scored" and ro.reward == 0.0, (ro.status, ro.error)


@pytest.mark.parametrize("target", ["/etc/hostname", "host-file"])
async def test_a_link_out_of_the_sandbox_is_wrong_not_an_infra_failure(store: Store, forge_home: Path,
                                                                      target: str) -> None:
    """A planted link to a host file holding exactly the expected text: the runner must not follow it
    (that would be reward for a file the agent did not write), and the rollout is the agent's 0, not
    an infrastructure failure that drops the group (a way out of a bad score)."""
    if target == "host-file":  # another rollout's output, in the same FORGE_HOME
        victim = forge_home / "sandboxes" / "ro-victim" / "work"
        victim.mkdir(parents=True)
        (victim / "out.txt").write_text("4\n")
        target = str(victim / "out.txt")
    want = Path(target).read_text()
    task = TaskSpec(id="t", instruction="write out.txt", expect_files={"out.txt": want})
    ro = await _attack(store, f"ln -s {target} out.txt", task)
    assert ro.status == "scored" and ro.reward == 0.0, (ro.status, ro.error)


async def test_a_link_replacing_the_graders_folders_is_the_agents_zero(store: Store, forge_home: Path) -> None:
    """`.forge` (the answer file's folder) and `.verify` (the verifier's) made links out of the sandbox:
    `.forge` to another rollout's folder whose answer file holds the right answer. The answer is not read
    through the link (the agent's 0), and the grader writes neither its answer file nor the verifier's
    files through them: it moves the links aside and writes in the sandbox, where the verifier runs."""
    victim = forge_home / "sandboxes" / "ro-victim" / "work"
    (victim / ".forge").mkdir(parents=True)
    (victim / ".forge" / "answer.txt").write_text("4\n")
    (victim / ".verify").mkdir()
    task = TaskSpec(id="t", instruction="say 4", expect_answer={"number": 4}, verifier="python3 -I .verify/check.py",
                    verifier_files={".verify/check.py": "print('score: 1')\n"})
    ro = await _attack(store, f"ln -s {victim / '.forge'} .forge && ln -s {victim / '.verify'} .verify", task)
    assert ro.status == "scored" and ro.reward == 0.0, (ro.status, ro.reward, ro.error)
    graded = ro.verifier_output or ""
    assert "answer: wrong" in graded and "score: 1" in graded, graded  # the verifier ran, in the sandbox
    assert (victim / ".forge" / "answer.txt").read_text() == "4\n"  # not overwritten through the link
    assert list((victim / ".verify").iterdir()) == []  # the verifier's files went into the sandbox


# -- the verifier's output --------------------------------------------------------------------------


async def test_a_verifier_output_cut_at_the_cap_never_passes(store: Store) -> None:
    """A verifier printing the agent's output before its own `score: 0`: the agent prints past the
    output cap so that the score line is cut off; no score line on exit 0 would read as 1.0."""
    task = TaskSpec(id="t", instruction="make log.txt", verifier="cat log.txt; echo 'score: 0'")
    ro = await _attack(store, "yes 'all good' | head -c 3000000 > log.txt", task, max_output_bytes=65536)
    assert ro.status == "scored" and ro.reward == 0.0, (ro.reward, (ro.verifier_output or "")[-200:])


# -- what the agent leaves for the verifier ---------------------------------------------------------

CHECK = "import json\nprint('score:', json.dumps(0))\n"
PLANT_SCORE = "import os\nprint('score: 1', flush=True)\nos._exit(0)\n"


@pytest.mark.parametrize("plant", ["dot-verify-module", "user-site"])
async def test_what_the_agent_leaves_cannot_run_inside_the_verifier(store: Store, plant: str) -> None:
    """A verifier without `-I` (as a task author may write it): a `json.py` planted in `.verify/` sits
    on its import path, a usercustomize.py in the agent's $HOME user site runs at its start."""
    if not os.path.exists("/usr/bin/python3"):
        pytest.skip("needs a system python3 (user site enabled)")
    if plant == "dot-verify-module":
        script = "mkdir -p .verify && printf \"%s\" \"$PLANT\" > .verify/json.py"
    else:
        script = ("d=$(/usr/bin/python3 -c 'import site; print(site.getusersitepackages())') && mkdir -p $d "
                  "&& printf \"%s\" \"$PLANT\" > $d/usercustomize.py")
    task = TaskSpec(id="t", instruction="nothing", verifier="/usr/bin/python3 .verify/check.py",
                    verifier_files={".verify/check.py": CHECK})
    ro = await _attack(store, script, task, env={"PLANT": PLANT_SCORE})
    assert ro.status == "scored" and ro.reward == 0.0, (ro.reward, ro.verifier_output)


# -- exact answers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("expect", "answer"), [
    ({"number": 4}, "\uff14"),  # FULLWIDTH DIGIT FOUR: float() reads it as 4
    ({"number": 4}, "\u0664"),  # ARABIC-INDIC DIGIT FOUR
    ({"number": 4}, "4.0000000000000001"),  # 4 as a float, not as a number
    ({"number": 4}, "4\0"),
    ({"words": "hello world"}, "hello \u043c\u0438\u0440 world"),  # a Cyrillic word the tokeniser skipped
    ({"words": "kit"}, "\u212ait"),  # KELVIN SIGN lower-cases to k
    ({"words": "hello world"}, "hello\0world\0"),
    ({"text": "OK"}, "\uff2f\uff2b"),
    ({"text": "OK"}, "O\u200bK"),
])
def test_confusables_are_not_the_expected_answer(expect: dict, answer: str) -> None:
    assert not answer_matches(ExpectedAnswer(**expect), answer)


@pytest.mark.parametrize(("expect", "answer"), [
    ({"number": 4}, "4"), ({"number": 4}, "+4.0"), ({"number": 4}, "**4**"), ({"number": 0.1}, "0.10"),
    ({"number": -2.5}, "-2.5."), ({"words": "hello world"}, "Hello, World!"), ({"text": "OK"}, " `OK` "),
])
def test_plain_right_answers_still_match(expect: dict, answer: str) -> None:
    assert answer_matches(ExpectedAnswer(**expect), answer)


# -- processes that outlive the agent's exec --------------------------------------------------------

# The verdict replaced whole (a rename), never truncated then written: the exec's `cat` below once read
# the file between the two (CI: stdout '' under load).
LOOP = "while :; do echo 'score: 1' > {f}.new; mv -f {f}.new {f}; sleep 0.05; done"
ESCAPES = {
    "nohup": "nohup sh -c \"{loop}\" >/dev/null 2>&1 &",
    # A nested user namespace needs no capability; with it, a pid namespace of its own (-p -f).
    "unshare-user-pid": "unshare -Upf sh -c \"{loop}\" >/dev/null 2>&1 &",
    "unshare-then-setsid": "unshare -U setsid sh -c \"{loop}\" >/dev/null 2>&1 &",
}


@pytest.mark.parametrize("escape", sorted(ESCAPES))
async def test_no_escape_outlives_the_exec(escape: str) -> None:
    async with make_sandbox(_bwrap_config(), run_id="run-rt", rollout_id=f"ro-rt-{escape}-{os.getpid()}") as sb:
        verdict = f"{sb.info.workdir}/verdict.txt"
        cmd = ESCAPES[escape].format(loop=LOOP.format(f=verdict))
        wait = f"for i in $(seq 100); do [ -s {verdict} ] && break; sleep 0.1; done"
        done = await sb.exec(f"{cmd} {wait}; cat {verdict}", timeout=30)
        assert done.stdout == "score: 1\n", (done.stdout, done.stderr)  # the helper really ran
        await sb.kill_all()
        await sb.write_file("verdict.txt", b"score: 0\n")
        await asyncio.sleep(0.4)
        assert await sb.read_file("verdict.txt") == b"score: 0\n"


# -- what the sandbox can see -----------------------------------------------------------------------


async def test_the_task_set_and_the_store_stay_hidden_even_under_a_bound_folder(forge_home: Path,
                                                                              tmp_path: Path) -> None:
    """The built-in tasks (their expected answers and verifiers) and FORGE_HOME (the store) are never
    visible, even when a folder bound into the sandbox holds them (a wheel install puts the tasks in
    the venv, which every sandbox sees; a FORGE_HOME under `read_only_paths`)."""
    (forge_home / "forge.db").write_bytes(b"SQLite format 3\0 the store")
    cfg = _bwrap_config(read_only_paths=[str(BUILTIN_DIR.parent), str(tmp_path)])
    async with make_sandbox(cfg, run_id="run-rt", rollout_id=f"ro-rt-see-{os.getpid()}") as sb:
        seen = await sb.exec(f"cat {BUILTIN_DIR}/easy.jsonl | head -c 100; echo; cat {forge_home}/forge.db; "
                             f"test -f {BUILTIN_DIR.parent}/grading.py && echo bound", timeout=20)
        assert "expect_answer" not in seen.stdout and "the store" not in seen.stdout, seen.stdout
        assert seen.stdout.strip().endswith("bound")  # the folders around them are there, read-only


# -- host-side cleanup of what the sandbox left -----------------------------------------------------


def test_removing_a_sandbox_never_chmods_through_a_planted_link(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Removing a folder the agent made read-only fails for a non-root owner (EACCES), and `remove_tree`
    then chmods its way in: never through a link the agent planted there (a host file of the same
    user would become 0700). Root never sees that EACCES, so it is raised here as the kernel would."""
    import shutil

    from openforge.sandbox.local import remove_tree

    victim, sandbox = tmp_path / "victim.txt", tmp_path / "sb"
    victim.write_text("the user's file\n")
    os.chmod(victim, 0o600)
    (sandbox / "d").mkdir(parents=True)
    link = sandbox / "d" / "link"
    link.symlink_to(victim)
    real_unlink, refused = os.unlink, []

    def unlink(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if os.path.basename(str(path)) == "link" and not refused:  # rmtree unlinks by name (dir_fd)
            refused.append(path)
            raise PermissionError(13, "Permission denied", str(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    monkeypatch.setattr(shutil.os, "unlink", unlink)
    remove_tree(sandbox)
    assert refused and not sandbox.exists()
    assert oct(victim.stat().st_mode & 0o777) == oct(0o600)


async def test_a_verifier_can_keep_its_memory_from_the_agents_code_it_runs() -> None:
    """The agent's program, run by a verifier, is the same user: it can open the verifier's
    /proc/PID/mem (where the expected values are) unless the verifier made itself non-dumpable, as
    the built-in verifiers that run the agent's code do (rollouts/tasks/builtin/generate.py KEEP_OUT)."""
    peek = "import os; open(f'/proc/{os.getppid()}/mem', 'rb'); print('read')"
    parent = ("import ctypes, subprocess, sys\n"
              "if sys.argv[1] == 'guarded':\n    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)\n"
              f"print(subprocess.run([sys.executable, '-c', {peek!r}], capture_output=True, text=True).stdout or 'denied')\n")
    async with make_sandbox(_bwrap_config(), run_id="run-rt", rollout_id=f"ro-rt-mem-{os.getpid()}") as sb:
        await sb.write_file("parent.py", parent.encode())
        open_ = await sb.exec(["python3", "-I", "parent.py", "open"], timeout=30)
        guarded = await sb.exec(["python3", "-I", "parent.py", "guarded"], timeout=30)
    assert open_.stdout.strip() == "read", open_.stderr  # the attack works on a verifier that does nothing
    assert guarded.stdout.strip() == "denied", guarded.stderr


async def test_hardlinks_cannot_bring_a_host_file_into_the_sandbox() -> None:
    async with make_sandbox(_bwrap_config(), run_id="run-rt", rollout_id=f"ro-rt-ln-{os.getpid()}") as sb:
        done = await sb.exec("ln /etc/hostname h1; echo rc=$?; ln /usr/bin/env h2; echo rc=$?; ls", timeout=20)
    assert done.stdout.count("rc=1") == 2 and "h1" not in done.stdout and "h2" not in done.stdout, done.stdout

