"""Harbor / Terminal-Bench task folders as a forge task set: read faithfully, run through the real runner
and local sandboxes, graded by the task's own tests after the agent is gone, and never by a reward
file the agent could write."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers.harbor import _pytest_task, _task
from tests.helpers.paths import DATA
from openforge.config import ForgeConfig
from openforge.forge_cli.main import app
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import TaskSpec, load_tasks, validate_tasks
from openforge.rollouts.tasks.harbor.payload import HarborPayload
from openforge.rollouts.tasks.harbor.verifier import parse_reward, rewrite_paths
from openforge.rollouts.tasks.harbor.kind import FORGED_REWARD, PLANTED_PYTEST
from openforge.rollouts.tasks.selfcheck import (HOSTILE_ANSWERS, _StandInHarness,
                                               check_solutions)
from openforge.store import Store

DATA = DATA / "harbor"
TASKS = {t.id: t for t in load_tasks(DATA)}


def test_a_harbor_dataset_loads_as_tasks() -> None:
    assert sorted(TASKS) == ["count-rows", "fix-greeting", "hello-world"]
    hello, rows, greet = TASKS["hello-world"], TASKS["count-rows"], TASKS["fix-greeting"]
    # /app (the Dockerfile's WORKDIR) is the working directory the agent starts in
    assert hello.instruction == "Create a file called ./hello.txt that holds exactly one line: `Hello, world!`\n"
    assert rows.files == {"sales.csv": (DATA / "count-rows/environment/sales.csv").read_text()}
    assert greet.files.keys() == {"bin/greet.sh"}
    assert (hello.time_limit_s, rows.time_limit_s, greet.difficulty) == (60.0, 90.0, "medium")
    hello_h, rows_h = hello.payload(HarborPayload), rows.payload(HarborPayload)
    assert "harbor" in hello.tags and hello.solution and hello_h is not None and hello_h.tests is not None
    # the tests travel with the task, unrewritten, for the grader alone
    assert hello_h.tests.files["test.sh"] == (DATA / "hello-world/tests/test.sh").read_text()
    assert rows_h is not None and rows_h.tests is not None
    assert rows_h.tests.files.keys() == {"test.sh", "test_outputs.py"} and rows_h.tests.timeout_s == 60.0
    assert "/logs/verifier" not in hello.instruction and "reward" not in hello.instruction
    # one task folder, and the format named outright
    assert [t.id for t in load_tasks(DATA / "hello-world")] == ["hello-world"]
    assert len(load_tasks(f"harbor:{DATA}")) == 3


def test_harbor_paths_are_rewritten_only_where_a_path_starts() -> None:
    m = {"/app": "/sandbox/work", "/logs": "/sandbox/work/.h/logs"}
    assert rewrite_paths("cd /app && cat /app/x > /logs/verifier/reward.txt", m) == \
        "cd /sandbox/work && cat /sandbox/work/x > /sandbox/work/.h/logs/verifier/reward.txt"
    assert rewrite_paths('open("/app")  "/app/"', m) == 'open("/sandbox/work")  "/sandbox/work/"'
    assert rewrite_paths("/application a/app ./app $HOME/app /apps", m) == "/application a/app ./app $HOME/app /apps"


@pytest.mark.parametrize(("name", "data", "reward", "why"), [
    ("reward.txt", b"1\n", 1.0, None),
    ("reward.txt", b"0.25", 0.25, None),
    ("reward.json", b'{"reward": 0.5, "passed": 1}', 0.5, None),
    ("reward.json", b"1", 1.0, None),
    ("reward.txt", b"", 0.0, "does not hold a number"),
    ("reward.txt", b"1.5", 0.0, "outside [0, 1]"),
    ("reward.txt", b"nan", 0.0, "outside [0, 1]"),
    ("reward.txt", b"score: 1", 0.0, "does not hold a number"),
    ("reward.json", b'{"accuracy": 1}', 0.0, 'no "reward" key'),
    ("reward.json", b'{"reward": "1"}', 0.0, "not a number"),
    ("reward.json", b'{"reward": true}', 0.0, "not a number"),
])
def test_reward_files_are_read_exactly(name: str, data: bytes, reward: float, why: str | None) -> None:
    got, note = parse_reward(name, data)
    assert got == reward and (note is None if why is None else why in note)


def test_what_cannot_run_yet_is_refused_per_task_in_one_line(tmp_path: Path) -> None:
    tmp_path = tmp_path / "set"  # beside the test's FORGE_HOME
    ok = "echo 1 > /logs/verifier/reward.txt\n"
    _task(tmp_path, "builds", dockerfile="FROM ubuntu:24.04\nRUN apt-get update && \\\n    apt-get install -y jq\n", test_sh=ok)
    _task(tmp_path, "tools", toml='[[environment.mcp_servers]]\nname = "db"\nurl = "http://db:8000/sse"\n', test_sh=ok)
    _task(tmp_path, "no-tests")
    _task(tmp_path, "bad-toml", toml="[verifier\n", test_sh=ok)
    _task(tmp_path, "bad-limit", toml="[agent]\ntimeout_sec = -1\n", test_sh=ok)
    _task(tmp_path, "fine", test_sh=ok)
    compose = _task(tmp_path, "services", test_sh=ok)
    (compose / "environment" / "docker-compose.yaml").write_text("services:\n  db:\n    image: postgres:16\n"
                                                                 "    ports: ['5432:5432']\n")
    problems = {p.task_id: p.message for p in validate_tasks(tmp_path)}
    assert problems.keys() == {"builds", "tools", "no-tests", "bad-toml", "bad-limit", "services"}
    assert problems["builds"].startswith("environment/Dockerfile line 2: RUN needs an image build")
    assert "mcp_servers" in problems["tools"] and "on the agent's own network" in problems["tools"]
    assert "tests/test.sh: missing" in problems["no-tests"]
    assert problems["bad-toml"].startswith("bad task.toml") and "timeout_sec" in problems["bad-limit"]
    assert "docker-compose" in problems["services"]
    assert all("\n" not in m for m in problems.values())


async def _run(store: Store, scripts: dict[str, str], tasks: list[TaskSpec], *, solved: bool = False) -> dict[str, tuple]:
    """Each task run with its script; `solved`: as the reference run, its solution/ files in the sandbox."""
    run = store.create_run(kind="check")
    harness = _StandInHarness(scripts, solutions={t.id: t for t in tasks} if solved else None)
    runner = RolloutRunner(store, config=ForgeConfig(), proxy_url="http://127.0.0.1:9", harness=harness)
    out = await runner.run(run.id, [RolloutSpec(t) for t in tasks])
    return {ro.task_id: (ro.status, ro.reward, ro.error, ro.verifier_output) for ro in out}


async def test_the_tests_grade_after_the_agent_and_a_forged_reward_scores_zero(store: Store) -> None:
    hello = TASKS["hello-world"]
    scripts = {
        "solved": hello.solution,
        "wrong": "echo 'Hello world' > hello.txt",
        "forger": FORGED_REWARD,
        # the agent tries to reach the tests and the reward through what it can see: nothing is there yet
        "snoop": "ls -a; ls -a .. ; test ! -e /tests && test ! -e /logs && echo 1 > hello.txt",
    }
    for label, script in scripts.items():
        [(status, reward, error, output)] = (await _run(store, {hello.id: script}, [hello],
                                                        solved=label == "solved")).values()
        assert (status, reward) == ("scored", 1.0 if label == "solved" else 0.0), (label, error, output)
        assert "reward.txt: " in output, output  # the reward came from the file test.sh wrote, read on the host
    # partial credit through reward.json, from the task's own tests
    greet = TASKS["fix-greeting"]
    half = "printf '#!/bin/sh\\necho \"Hello, $1!\"\\n' > bin/greet.sh"
    assert (await _run(store, {greet.id: half}, [greet]))[greet.id][:2] == ("scored", 0.5)


async def test_a_verifier_that_cannot_run_is_infrastructure_never_a_reward(store: Store, tmp_path: Path) -> None:
    cases = {
        "no-reward": "echo all good\n",  # ran to its end, wrote nothing: the agent's 0
        "too-big": "echo 7 > /logs/verifier/reward.txt\n",  # out of range: 0, with a note
        "missing-tool": "no-such-checker /app\n",  # a command the sandbox lacks: cannot verify
        "killed": "kill -9 $$\n",  # the verifier died: not scored from anything it left
        "slow": "echo 1 > /logs/verifier/reward.txt; sleep 30\n",  # past its timeout: the file is not read
    }
    tmp_path = tmp_path / "set"
    for name, body in cases.items():
        _task(tmp_path, name, test_sh=body, toml="[verifier]\ntimeout_sec = 2\n")
    tasks = load_tasks(tmp_path)
    got = await _run(store, {}, tasks)
    assert got["no-reward"][:2] == ("scored", 0.0) and "without writing" in got["no-reward"][2]
    assert got["too-big"][:2] == ("scored", 0.0) and "outside [0, 1]" in got["too-big"][2]
    assert got["slow"][:2] == ("scored", 0.0) and "timeout of 2s" in got["slow"][2]
    for name in ("missing-tool", "killed"):
        status, reward, error, _ = got[name]
        assert (status, reward) == ("failed", None), got[name]
        assert error.startswith("infra: the task's verifier could not run: test.sh could not run to its end")


async def test_validate_run_on_the_harbor_set(store: Store, forge_home: Path) -> None:
    assert await check_solutions(store, ForgeConfig(), list(TASKS.values())) == []
    [run] = [r for r in store.list_runs() if r.kind == "check"]
    rollouts = store.list_rollouts(run.id)
    # solved, hostile answers, forged reward, planted pytest
    assert len(rollouts) == len(TASKS) * (3 + len(HOSTILE_ANSWERS))
    assert {r.task_id: r.reward for r in rollouts if r.step == 0} == {t: 1.0 for t in TASKS}
    assert [(r.task_id, r.step, r.reward) for r in rollouts if r.step > 0 and r.reward != 0.0] == []
    assert all(r.status == "scored" for r in rollouts)


def test_forge_tasks_validate_run_on_a_harbor_dataset(forge_home: Path, tmp_path: Path) -> None:
    out = CliRunner().invoke(app, ["tasks", "validate", str(DATA), "--run"])
    assert out.exit_code == 0, out.output
    assert "3 task(s) ok (easy 2, medium 1, solutions checked)" in out.output
    # a reference solution that does not pass is named, per task
    broken = tmp_path / "set"
    shutil.copytree(DATA / "hello-world", broken / "hello-world")
    (broken / "hello-world" / "solution" / "solve.sh").write_text("#!/bin/bash\necho hi > /app/hello.txt\n")
    out = CliRunner().invoke(app, ["tasks", "validate", str(broken), "--run"])
    assert out.exit_code == 1
    assert "solution check [hello-world]: the reference solution scores 0 < pass_threshold 1" in out.output


async def test_the_reference_run_has_the_whole_solution_folder_and_an_agent_has_none(
        store: Store, tmp_path: Path, forge_home: Path) -> None:
    # Harbor's oracle uploads solution/ to /solution and runs /solution/solve.sh: a helper script and a
    # data file beside it, reached by /solution paths and by $0, write the answer into the WORKDIR.
    folder = _task(tmp_path / "set", "helper", test_sh="""
        grep -qx "token-5b1d" /app/out.txt && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
        """, instruction="Write the token into /app/out.txt.")
    (folder / "solution" / "lib").mkdir(parents=True)
    (folder / "solution" / "solve.sh").write_text('#!/bin/bash\nbash "$(dirname "$0")/lib/write.sh" /app/out.txt\n')
    (folder / "solution" / "lib" / "write.sh").write_text("#!/bin/bash\ncat /solution/token.txt > \"$1\"\n")
    (folder / "solution" / "token.txt").write_text("token-5b1d\n")
    [task] = load_tasks(tmp_path / "set")
    assert task.solution_files.keys() == {"solve.sh", "lib/write.sh", "token.txt"}
    assert "token-5b1d" not in task.instruction + "".join(task.files.values())
    assert await check_solutions(store, ForgeConfig(), [task]) == []
    [run] = store.list_runs()
    assert [(r.status, r.reward) for r in store.list_rollouts(run.id, step=0)] == [("scored", 1.0)]
    # An agent run (any harness but the reference run's) looks where the solution went: nothing is there.
    snoop = ('for f in "$HOME/solution/token.txt" /solution/token.txt; do cat "$f" >> out.txt; done 2>/dev/null; '
             'ls -a "$HOME" /solution >> listing.txt 2>&1; grep -rl token-5b1d "$HOME" . /tmp >> out.txt 2>/dev/null; true')
    [(status, reward, error, output)] = (await _run(store, {task.id: snoop}, [task])).values()
    assert (status, reward) == ("scored", 0.0), (error, output)
    # The reference run without the folder: solve.sh is not there to run.
    [problem] = await check_solutions(store, ForgeConfig(), [task.model_copy(update={"solution_files": {}})])
    assert "/solution/solve.sh: No such file" in problem.message, problem


async def test_the_tests_never_load_a_conftest_or_pytest_ini_the_agent_wrote(store: Store, tmp_path: Path) -> None:
    # Issue 43: the tests ran from a folder under the agent's working directory, so pytest's rootdir was the
    # agent's and its conftest.py (exit 0 before any test) or pytest.ini (collect only) scored 1.0.
    _pytest_task(tmp_path / "set")
    [task] = load_tasks(tmp_path / "set")
    agents = {
        "honest": ("echo 42 > answer.txt", 1.0),
        "conftest": ("printf 'import os\\nos._exit(0)\\n' > conftest.py", 0.0),
        "planted": (PLANTED_PYTEST, 0.0),  # a conftest.py, pytest.py and pytest.ini in every folder it can write
    }
    tasks = [task.model_copy(update={"id": label}) for label in agents]
    got = await _run(store, {label: script for label, (script, _) in agents.items()}, tasks)
    assert {label: got[label][:2] for label in agents} == {label: ("scored", want)
                                                           for label, (_, want) in agents.items()}, got


@pytest.mark.slow  # nine rollouts, each running pytest
async def test_validate_run_names_a_task_whose_tests_run_the_agents_pytest(store: Store, tmp_path: Path) -> None:
    # `python -m pytest` from the WORKDIR puts the agent's folder first on the import path (in Harbor too):
    # the planted pytest.py passes it, and `forge tasks validate --run` says so.
    _pytest_task(tmp_path / "set", "module", runner=f"{sys.executable} -m pytest")
    problems = await check_solutions(store, ForgeConfig(), load_tasks(tmp_path / "set"))
    assert [(p.task_id, p.message) for p in problems] == [
        ("module", "gives credit to hostile answers (must be 0): planted pytest 1")]
