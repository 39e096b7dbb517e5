"""A multi-step Harbor task's `[[steps]]`: one instruction, one verifier and one gate per step.

Harbor (harbor-framework/harbor 0.26.0, `harbor/trial/multi_step.py`, `models/task/config.py`
StepConfig) runs a task whose task.toml declares `[[steps]]` as one trial in one environment:

    for each step, in the order declared:
        the agent is given steps/<name>/instruction.md (a fresh agent session: resuming the previous
          step's session is the trial option `agent.resume_trajectory`, off by default)
        its agent timeout: [steps.agent] timeout_sec, else [agent] timeout_sec
        the tests: tests/ and steps/<name>/tests/ uploaded to /tests (the step's files win), the
          step's test.sh (else the shared one) run with [steps.verifier] timeout_sec / env
        min_reward set and the step's reward below it (or no reward at all): the remaining steps are skipped
    the trial's reward (`multi_step_reward_strategy`): "mean" (the default) of the steps that were
    graded, or "final", the last graded step's reward

Between steps Harbor empties /tests and /logs/verifier, so the next step's agent never sees the
tests just run. The oracle agent (`harbor/agents/oracle.py`) runs steps/<name>/solution/solve.sh
from /solution at each step.

Harbor's StepConfig has no `dependencies` or `inherit_prior_session` (the real sets write them):
Harbor ignores both, and so does forge, which runs each step as a fresh harness run in the same
sandbox, as Harbor does by default. One deliberate difference: a step whose test.sh ran but wrote no
usable reward (or ran past its timeout) counts 0.0 in the mean, where Harbor leaves it out of the
denominator; otherwise an agent could break step 2's tests and keep step 1's full reward.

What forge does not run yet is refused with one line per task: a step's `workdir/` (files and a
setup.sh staged before it), a step healthcheck, a min_reward on reward keys other than "reward", a
step's own verifier environment, and steps in a task with MCP servers (the task's tool server lives
for one harness run).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from openforge.rollouts.tasks.harbor.verifier import HarborTests, rewrite_paths


class _Section(BaseModel):
    model_config = ConfigDict(extra="allow")  # Harbor ignores fields it does not know; so does forge


class _StepAgent(_Section):
    timeout_sec: float | None = Field(None, gt=0)


class _StepVerifier(_Section):
    timeout_sec: float | None = Field(None, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    environment: dict[str, Any] | None = None
    environment_mode: str | None = None


class StepSection(_Section):
    """One `[[steps]]` table: the subset of Harbor's StepConfig forge reads, same names and defaults."""

    name: str = Field(min_length=1)
    agent: _StepAgent = Field(default_factory=_StepAgent)
    verifier: _StepVerifier = Field(default_factory=_StepVerifier)
    min_reward: float | dict[str, float] | None = None
    healthcheck: dict[str, Any] | None = None


class HarborStep(BaseModel):
    """One step as a rollout runs it (kept on the task, never shown to the agent but its instruction)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    instruction: str = Field(description="steps/<name>/instruction.md, paths mapped as the task's")
    tests: HarborTests = Field(description="tests/ with steps/<name>/tests/ over it, the step's timeout and env")
    time_limit_s: float = Field(gt=0, description="[steps.agent] timeout_sec, else the task's")
    min_reward: float | None = Field(None, description="below it, the remaining steps are skipped")
    solution_files: dict[str, str] = Field(default_factory=dict, description=(
        "steps/<name>/solution/: written to /solution for the reference run's step alone"))


class HarborSteps(BaseModel):
    """A multi-step Harbor task's steps and how their rewards make the rollout's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: list[HarborStep] = Field(min_length=1)
    reward: Literal["mean", "final"] = Field("mean", description="multi_step_reward_strategy")

    def combined(self, rewards: list[float]) -> float:
        """The rollout's reward from the rewards of the steps that were graded, in order (Harbor's
        `_select_multi_step_reward`): their mean, or the last one's. Rewards [1.0, 0.0]: mean 0.5, final 0.0."""
        if not rewards:
            return 0.0
        return rewards[-1] if self.reward == "final" else sum(rewards) / len(rewards)


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def harbor_steps(folder: Path, raw_steps: list[dict[str, Any]], strategy: str | None, *, shared_tests: dict[str, str],
                 verifier: HarborTests, agent_timeout_s: float, to_workdir: dict[str, str],
                 text_tree: Callable[[Path], dict[str, str]]) -> tuple[HarborSteps | None, list[str]]:
    """(the task's HarborSteps, []) or (None, one line per reason forge cannot run them). `verifier` holds the
    task's [verifier] settings and WORKDIR; `text_tree` reads a folder as harbor/folder.py does."""
    reasons: list[str] = []
    if strategy not in (None, "mean", "final"):
        return None, [f"multi_step_reward_strategy = {strategy!r}: Harbor knows 'mean' and 'final'"]
    steps = []
    for i, raw in enumerate(raw_steps):
        try:
            section = StepSection.model_validate(raw)
        except ValidationError as exc:
            return None, [f"task.toml: steps.{i}.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
        where = f"step {section.name!r}"
        step_dir = folder / "steps" / section.name
        if not step_dir.resolve().is_relative_to((folder / "steps").resolve()) or not step_dir.is_dir():
            reasons.append(f"{where}: no folder steps/{section.name}")
            continue
        min_reward = section.min_reward
        if isinstance(min_reward, dict):
            if set(min_reward) - {"reward"}:
                reasons.append(f"{where}: min_reward on keys {sorted(min_reward)}: forge reads only \"reward\"")
            min_reward = min_reward.get("reward")
        if (step_dir / "workdir").exists():
            reasons.append(f"{where}: steps/{section.name}/workdir/ (files and setup.sh before the step) "
                           "is not supported yet")
        if section.healthcheck is not None:
            reasons.append(f"{where}: a step healthcheck is not supported yet")
        if section.verifier.environment is not None or section.verifier.environment_mode == "separate":
            reasons.append(f"{where}: a separate verifier environment is not supported yet")
        tests_dir = step_dir / "tests"
        if not (tests_dir / "test.sh").is_file() and "test.sh" not in shared_tests:
            reasons.append(f"{where}: no steps/{section.name}/tests/test.sh nor tests/test.sh")
        if not (step_dir / "instruction.md").is_file():
            reasons.append(f"{where}: steps/{section.name}/instruction.md missing")
        if reasons:
            continue
        try:
            tests = {**shared_tests, **(text_tree(tests_dir) if tests_dir.is_dir() else {})}
            instruction = _read(step_dir / "instruction.md")
            solution_dir = step_dir / "solution"
            solution = text_tree(solution_dir) if (solution_dir / "solve.sh").is_file() else {}
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            reasons.append(f"{where}: {exc}")
            continue
        steps.append(HarborStep(
            name=section.name, instruction=rewrite_paths(instruction, to_workdir),
            tests=verifier.model_copy(update={
                "files": tests, "timeout_s": section.verifier.timeout_sec or verifier.timeout_s,
                "env": {**verifier.env, **section.verifier.env}}),
            time_limit_s=section.agent.timeout_sec or agent_timeout_s, min_reward=min_reward,
            solution_files=solution))
    if reasons:
        return None, reasons
    return HarborSteps(steps=steps, reward=strategy or "mean"), []
