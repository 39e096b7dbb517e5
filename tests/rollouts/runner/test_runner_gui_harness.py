"""A GUI harness (mini-gui, browser-use) on a task with no site: forge starts a display only around a GUI
task's site (there is no desktop yet), so the rollout is masked with that reason before the harness runs,
never scored 0 for the policy (docs/tasks.md, "The imported sets through `forge eval`")."""

from __future__ import annotations

import pytest

from openforge.config import ForgeConfig, HarnessConfig
from openforge.rollouts.harnesses import get_harness
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import TaskSpec

# An OSWorld-format task is of this kind: done with a shell, graded on what it left behind.
TASK = TaskSpec(id="shell-task", instruction="Create a folder named test here.", verifier="test -d test && echo 'score: 1'")


@pytest.mark.parametrize("name", ["mini-gui", "browser-use"])
async def test_a_gui_harness_on_a_task_without_a_site_is_an_infra_failure(store, name: str) -> None:  # noqa: ANN001
    config = ForgeConfig()
    runner = RolloutRunner(store, config=config, proxy_url="http://127.0.0.1:9",
                           harness=get_harness(HarnessConfig(name=name)))
    run = store.create_run(kind="eval")
    [ro] = await runner.run(run.id, [RolloutSpec(TASK, 0)])
    assert (ro.status, ro.failure_kind, ro.reward) == ("failed", "infra", None), (ro.error, ro.stdout)
    assert f"harness {name} acts on a display" in ro.error and "task shell-task has none" in ro.error
    assert ro.n_calls == 0
