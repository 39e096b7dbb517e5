"""The reward function for `forge export --format verl-rl` rows, in veRL's custom reward interface.

    # veRL config (ppo_trainer.yaml), with openforge installed in veRL's environment:
    reward.custom_reward_function.path=/path/to/openforge/integrations/verl/reward.py
    reward.custom_reward_function.name=compute_score

veRL calls `compute_score(data_source, solution_str, ground_truth, extra_info)` on every response; the
row's `extra_info.task` holds the task record, `reward_model.ground_truth` its expected answer. The
response is graded the way the rollout runner grades a final answer, with the same code:

- a task graded only by its expected answer (no shell verifier, no expected files): `answer_matches`
  on the host, exactly as the runner does (rollouts/tasks/grading.py): 1.0 or 0.0;
- any other task: a fresh sandbox set up as for a rollout (the sandbox of the forge config named by
  `reward_kwargs.forge_config`, else ./forge.toml, else the defaults: local), the
  response given as the agent's final answer by an agent that does nothing else, then the task's own
  expected-file checks and shell verifier (rollouts/runner/runner.py). A response is text, so a task whose
  verdict needs files the agent writes scores 0 here: train those through the harness instead.

A reward is never guessed: a sandbox that fails to start, or a row that is not ours, raises.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

DATA_SOURCE = "openforge.integrations.verl.reward"


def task_from_row(extra_info: dict[str, Any] | None, ground_truth: str | None) -> Any:
    from openforge.rollouts.tasks.grading import ExpectedAnswer
    from openforge.rollouts.tasks.format import TaskSpec

    record = (extra_info or {}).get("task")
    if not record:
        raise ValueError("extra_info.task is missing: this row was not written by `forge export --format verl-rl`")
    task = TaskSpec.model_validate(json.loads(record) if isinstance(record, str) else record)
    if ground_truth:  # the row's ground truth is the one graded (a user may have edited it)
        task = task.model_copy(update={"expect_answer": ExpectedAnswer.model_validate(json.loads(ground_truth))})
    return task


async def _grade_in_sandbox(task: Any, answer: str, config_path: str | None) -> float:
    from openforge.config import load_config
    from openforge.store import Store
    from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
    from openforge.rollouts.tasks.selfcheck import _StandInHarness

    with tempfile.TemporaryDirectory(prefix="forge-verl-reward-") as tmp:
        store = Store(Path(tmp) / "grade.db")
        try:
            run = store.create_run(kind="check", name="verl reward")
            store.set_run_status(run.id, "running")
            runner = RolloutRunner(store, config=load_config(config_path), proxy_url="http://127.0.0.1:9",
                                   harness=_StandInHarness({}, {task.id: answer}))
            [ro] = await runner.run(run.id, [RolloutSpec(task)])
            store.set_run_status(run.id, "finished")
        finally:
            store.close()
    if ro.status != "scored" or ro.reward is None:
        raise RuntimeError(f"grading task {task.id} failed ({ro.status}): {ro.error}")
    return float(ro.reward)


def compute_score(data_source: str, solution_str: str, ground_truth: str | None = None,
                  extra_info: dict[str, Any] | None = None, forge_config: str | None = None, **_: Any) -> float:
    """The task's exact grade of `solution_str` as the final answer. `forge_config`: a forge.toml whose
    sandbox settings grade the tasks that need one (veRL: `reward_kwargs.forge_config`)."""
    from openforge.rollouts.tasks.grading import answer_matches

    if data_source != DATA_SOURCE:
        raise ValueError(f"data_source {data_source!r} is not graded here (this module grades {DATA_SOURCE!r})")
    task = task_from_row(extra_info, ground_truth)
    if task.verifier is None and not task.expect_files and task.expect_answer is not None:
        return 1.0 if answer_matches(task.expect_answer, solution_str) else 0.0
    # veRL may call this from inside an event loop: the sandbox's loop runs in its own thread.
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _grade_in_sandbox(task, solution_str, forge_config)).result()
