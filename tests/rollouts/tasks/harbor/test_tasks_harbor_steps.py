"""Multi-step Harbor tasks (`[[steps]]`): imported, run step by step through the real runner on the local
sandbox with the stand-in harness of `forge tasks validate --run`, and scored as Harbor scores a trial."""

from __future__ import annotations

import textwrap
from pathlib import Path

from openforge.config import ForgeConfig
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import TaskSpec, load_tasks, validate_tasks
from openforge.rollouts.tasks.harbor.payload import HarborPayload
from openforge.rollouts.tasks.selfcheck import _StandInHarness, check_solutions
from openforge.store import Store

# As the real set writes them: `dependencies` and `inherit_prior_session` are not Harbor fields (ignored).
TOML = """\
version = "1.0"
[agent]
timeout_sec = 120.0

[[steps]]
name = "1_step_one"
dependencies = []
min_reward = 1.0

[steps.verifier]
timeout_sec = 60.0

[[steps]]
name = "2_step_two"
dependencies = ["1_step_one"]
min_reward = 1.0
inherit_prior_session = true

[steps.agent]
timeout_sec = 90.0
"""
# Step one wants /app/a.txt holding "one"; step two wants b.txt holding "two" and a.txt still "one".
STEPS = {
    "1_step_one": ("Write the word one into /app/a.txt.",
                   '[ "$(cat /app/a.txt)" = one ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n',
                   "echo one > /app/a.txt\n"),
    "2_step_two": ("Now also write the word two into /app/b.txt.",
                   '[ "$(cat /app/a.txt)" = one ] && [ "$(cat /app/b.txt)" = two ] && echo 1 > /logs/verifier/reward.txt '
                   "|| echo 0 > /logs/verifier/reward.txt\n",
                   "cat /solution/word.txt > /app/b.txt\n"),
}


def _two_step_task(root: Path, name: str = "two-steps", toml: str = TOML) -> Path:
    """A multi-step Harbor task folder in the real set's layout: no root instruction.md, steps/<name>/."""
    folder = root / name
    (folder / "environment").mkdir(parents=True)
    (folder / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    (folder / "task.toml").write_text(toml)
    for step, (instruction, test_sh, solve_sh) in STEPS.items():
        for sub in ("tests", "solution"):
            (folder / "steps" / step / sub).mkdir(parents=True)
        (folder / "steps" / step / "instruction.md").write_text(instruction)
        (folder / "steps" / step / "tests" / "test.sh").write_text("#!/bin/bash\n" + test_sh)
        (folder / "steps" / step / "tests" / "secret.txt").write_text(f"tests of {step}\n")
        (folder / "steps" / step / "solution" / "solve.sh").write_text("#!/bin/bash\n" + solve_sh)
    (folder / "steps" / "2_step_two" / "solution" / "word.txt").write_text("two\n")
    return folder


async def _run(store: Store, task: TaskSpec, script: str) -> tuple:
    run = store.create_run(kind="check")
    runner = RolloutRunner(store, config=ForgeConfig(), proxy_url="http://127.0.0.1:9",
                           harness=_StandInHarness({task.id: script}))
    [ro] = await runner.run(run.id, [RolloutSpec(task)])
    return ro.status, ro.reward, ro.error, ro.verifier_output


def test_a_multi_step_task_imports_its_steps(tmp_path: Path) -> None:
    _two_step_task(tmp_path / "set")
    [task] = load_tasks(tmp_path / "set")
    harbor = task.payload(HarborPayload)
    assert harbor is not None
    steps = harbor.steps
    assert steps is not None and [s.name for s in steps.steps] == ["1_step_one", "2_step_two"]
    assert steps.reward == "mean" and [s.min_reward for s in steps.steps] == [1.0, 1.0]
    # the step's own timeouts, else the task's; /app mapped to the working directory as the task's own
    assert [s.time_limit_s for s in steps.steps] == [120.0, 90.0]
    assert [s.tests.timeout_s for s in steps.steps] == [60.0, 600.0]
    assert task.instruction == "Write the word one into ./a.txt." and harbor.tests == steps.steps[0].tests
    assert steps.steps[1].solution_files.keys() == {"solve.sh", "word.txt"}
    assert task.solution == "bash /solution/solve.sh"
    assert TaskSpec.model_validate(task.to_record()) == task  # as `forge tasks import` writes and reads it


def test_what_steps_cannot_run_yet_is_refused_in_one_line(tmp_path: Path) -> None:
    root = tmp_path / "set"
    (_two_step_task(root, "staged") / "steps" / "2_step_two" / "workdir").mkdir()
    _two_step_task(root, "keyed", TOML.replace("min_reward = 1.0\n", 'min_reward = { reward = 1.0, speed = 0.5 }\n', 1))
    _two_step_task(root, "strategy", 'multi_step_reward_strategy = "max"\n' + TOML)
    problems = {p.task_id: p.message for p in validate_tasks(root)}
    assert problems.keys() == {"staged", "keyed", "strategy"}
    assert "workdir/" in problems["staged"] and "speed" in problems["keyed"] and "'max'" in problems["strategy"]
    assert all("\n" not in m for m in problems.values())


async def test_steps_run_in_one_sandbox_and_score_as_harbor_does(store: Store, tmp_path: Path) -> None:
    _two_step_task(tmp_path / "set")
    [task] = load_tasks(tmp_path / "set")
    # The reference run (each step's solve.sh, its solution/ at /solution), the hostile answers and a forged
    # reward file: Harbor's full reward for the first, exactly 0 for the rest.
    assert await check_solutions(store, ForgeConfig(), [task]) == []
    [run] = store.list_runs()
    [solved] = store.list_rollouts(run.id, step=0)
    assert (solved.status, solved.reward) == ("scored", 1.0), solved.verifier_output
    assert "== step 2_step_two: reward 1" in solved.verifier_output
    # Only step one done: step two runs (1 >= min_reward) and scores 0; Harbor's mean of the two is 0.5.
    status, reward, error, output = await _run(store, task, "echo one > a.txt")
    assert (status, reward) == ("scored", 0.5), (error, output)
    # ... and 0.0 under multi_step_reward_strategy = "final" (the last graded step's reward).
    harbor = task.payload(HarborPayload)
    assert harbor is not None and harbor.steps is not None
    final = task.model_copy(update={"family": harbor.model_copy(update={
        "steps": harbor.steps.model_copy(update={"reward": "final"})})})
    assert (await _run(store, final, "echo one > a.txt"))[:2] == ("scored", 0.0)
    # Step one failed its min_reward: step two is never run, though this agent's b.txt would pass its test.
    status, reward, error, output = await _run(store, task, "echo two > b.txt; echo uno > a.txt")
    assert (status, reward) == ("scored", 0.0), (error, output)
    assert "later steps skipped" in output and "== step 2_step_two" not in output
    # Both steps done by an agent that also copies whatever tests it can find into b.txt: step one's tests
    # are gone before step two's agent runs, so it finds none and scores the full reward.
    snoop = ("test -f a.txt || echo one > a.txt; echo two > b.txt; "
             "cat /forge-grader/*/tests/secret.txt /forge-grader/tests/secret.txt >> b.txt 2>/dev/null; true")
    assert (await _run(store, task, snoop))[:2] == ("scored", 1.0)


def test_a_task_refused_for_a_step_never_costs_its_build(tmp_path: Path, monkeypatch) -> None:
    """Steps are checked before the image is built: a Dockerfile that RUNs something is built only for a task
    whose steps forge can run (the engine is replaced at its edge: the build call is what is counted)."""
    import openforge.rollouts.tasks.harbor.image as harbor_image

    root = tmp_path / "set"
    for name in ("staged", "runs"):
        folder = _two_step_task(root, name)
        (folder / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\nRUN touch /app/x\n")
    (root / "staged" / "steps" / "2_step_two" / "workdir").mkdir()
    built = []

    def build_task_image(folder: Path, workdir: str, **_: object) -> tuple:
        built.append(folder.name)
        return harbor_image.TaskImage(tag=f"forge-test/{folder.name}:1", workdir=workdir), True

    class Engine:
        def close(self) -> None: ...

    monkeypatch.setattr(harbor_image, "build_task_image", build_task_image)
    monkeypatch.setattr(harbor_image, "_connect", Engine)
    report = harbor_image.import_harbor(root)
    assert built == ["runs"] and [t["id"] for t in report.tasks] == ["runs"]
    assert [(tid, "workdir/" in why) for tid, why in report.refused] == [("staged", True)]
    assert report.tasks[0]["image"]["tag"] == "forge-test/runs:1"
    assert report.tasks[0]["family"]["steps"]["steps"][0]["instruction"] == "Write the word one into ./a.txt."
