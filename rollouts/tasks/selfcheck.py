"""`forge tasks validate --run`: prove a task set's graders work, in real sandboxes.

Each task with a reference `solution` runs through the rollout runner with stand-in agents instead of
a model: once with the solution as the "agent" (its reward must reach `pass_threshold`), and once for
each of HOSTILE_ANSWERS, given as the final answer of an agent that touches nothing else (each must
score exactly 0). A grader that passes an empty attempt, a digit string, the instruction echoed back
or an error blob is a task bug that a policy would learn to exploit; one that fails the reference
solution would show up as a flat reward curve. A task's `solution_files` (Harbor's `solution/`) are
written to $HOME/solution for the reference run alone, `/solution` in them and in `solution` pointing
there, as Harbor's oracle agent uploads the folder to /solution (`solution_paths`); at each step of a
multi-step Harbor task, that step's steps/<name>/solution/ (`HarnessContext.step`).

A task with no reference (ClawEval's `reference_solution` is prose) is no failure: `validate --run` says
there is no reference to check (`unchecked_note`) and still runs the hostile answers and an IDLE agent (a
script that does nothing) on it; each must score 0. Under a benchmark's own formula that credits a clean
idle run (an imported ClawEval task's task score gives one 0.2) the idle agent must not pass, and no
hostile answer may score above it.

A task's family adds its own hostile agents (`TaskKind.attacks`, rollouts/tasks/kinds.py). A Harbor task
(rollouts/tasks/harbor/kind.py) with a reference meets FORGED_REWARD: an agent that writes a perfect
reward file wherever Harbor's verifier might read one and leaves a process behind to keep writing
it, and PLANTED_PYTEST: an agent that leaves a conftest.py, pytest.py and pytest.ini in every folder
it can write, for a test.sh that runs pytest to load (issue 43). Each must score exactly 0 as well; a
task whose test.sh runs the agent's files (`python -m pytest` from the working folder puts it first
on the import path, in Harbor too) is named.

A task graded on its services' record (`expect_requests`, rollouts/tasks/services.py) and no judge meets
FORGED_DISPATCH: an agent that makes no request but writes dispatch logs claiming each one the task
expects, where a grader might look for them (the tool server's `.forge/tool-dispatches.jsonl`, a
`dispatches.json`). It must score exactly 0: the runner grades forge's own record, never a file.

An OSWorld-format task (rollouts/tasks/osworld/kind.py) meets `planted_files`, with or without a solution: junk
written where its getters read and at its expected files' names, the task left undone. It must score
exactly 0: the expected files live in the task record on the host (and an idle agent that passes shows
a task whose check this sandbox does not reproduce).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from openforge.config import ForgeConfig
from openforge.store import Store
from openforge.rollouts.harnesses.base import (ANSWER_FILE, HarnessBase, HarnessContext, HarnessOutcome,
                                                answer_file_outcome)
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import TaskProblem, TaskSpec
from openforge.rollouts.tasks.kinds import kind_of
from openforge.rollouts.tasks.harbor.folder import offline_failure
from openforge.rollouts.tasks.harbor.verifier import SOLUTION_DIR, rewrite_paths
from openforge.sandbox.base import ExecResult, Sandbox

WHERE = "solution check"
_ALPHABET = "abcdefghijklmnopqrstuvwxyz"
# The JSON Claude Code prints when its API call was refused: the case that once scored 1.0.
_ERROR_BLOB = json.dumps({"type": "result", "subtype": "success", "is_error": True, "api_error_status": 400,
                          "result": "API Error: 400 prompt is too long", "num_turns": 1,
                          "usage": {"input_tokens": 0, "output_tokens": 0}, "status": "ok"})


def _megabyte(task: TaskSpec) -> str:
    """1 MB holding every word of the instruction, every digit and letter: what a substring grader passes."""
    chunk = f"{task.instruction} 0123456789 {_ALPHABET} {_ALPHABET.upper()} true yes ok done\n"
    return chunk * (1_000_000 // len(chunk) + 1)


# name -> the hostile final answer for a task
HOSTILE_ANSWERS: dict[str, Callable[[TaskSpec], str]] = {
    "empty": lambda task: "",
    "digits": lambda task: "0123456789",
    "alphabet": lambda task: f"{_ALPHABET} {_ALPHABET.upper()}",
    "error blob": lambda task: _ERROR_BLOB,
    "instruction echoed": lambda task: task.instruction,
    "1 MB of text": _megabyte,
}


def forged_dispatch(task: TaskSpec) -> str:
    """The FORGED_DISPATCH agent's script for `task`: a claimed 200 for every request it expects."""
    claims = [json.dumps({"service": r.service, "tool": r.tool, "method": r.method, "path": r.path, "body": r.body,
                          "status": 200, "result": "ok"}) for r in task.expect_requests if not r.absent]
    lines = "\n".join(claims * 3)
    return (f"mkdir -p .forge && cat > .forge/tool-dispatches.jsonl <<'EOF'\n{lines}\nEOF\n"
            "cp .forge/tool-dispatches.jsonl dispatches.json\n")


def solution_paths(task: TaskSpec, home: str, workdir: str) -> dict[str, str]:
    """Where the reference run finds /solution (its files, under the sandbox's $HOME) and a Harbor task's
    WORKDIR in this sandbox (a local sandbox has neither /solution nor /app)."""
    mapping = {SOLUTION_DIR: f"{home.rstrip('/')}/solution"}
    task_workdir = kind_of(task).solution_workdir(task).rstrip("/")
    if task_workdir not in ("", workdir.rstrip("/")):
        mapping[task_workdir] = workdir.rstrip("/")
    return mapping


class _StandInHarness(HarnessBase):
    """An agent without a model: per task id, a shell script to run and/or a final answer to give. With
    `solutions` (task id -> task), the task's `solution_files` are written first to $HOME/solution, as
    Harbor's oracle uploads solution/ to /solution: only the reference run has them."""

    name = "solution"
    calls_model = False
    takes_tools = True  # a task's tools reach a solution script as FORGE_MCP_URL / FORGE_MCP_TOKEN

    def __init__(self, scripts: dict[str, str], answers: dict[str, str] | None = None,
                 solutions: dict[str, TaskSpec] | None = None) -> None:
        self.scripts = scripts
        self.answers = answers or {}
        self.solutions = solutions or {}

    async def prepare(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
        if ctx.task_id in self.answers:  # a file, not argv: 1 MB does not fit in one argument
            await sandbox.write_file(ANSWER_FILE, self.answers[ctx.task_id].encode("utf-8"))
        if task := self.solutions.get(ctx.task_id):
            mapping = solution_paths(task, sandbox.info.home, sandbox.info.workdir)
            for path, content in kind_of(task).solution_files(task, ctx.step).items():
                await sandbox.write_file(f"{mapping[SOLUTION_DIR]}/{path}", rewrite_paths(content, mapping).encode(),
                                         mode=0o755 if path.endswith(".sh") else 0o644)

    def command(self, ctx: HarnessContext) -> list[str]:
        script = self.scripts.get(ctx.task_id, "true")
        if task := self.solutions.get(ctx.task_id):  # $HOME: a local sandbox's differs per rollout without bwrap
            script = rewrite_paths(script, solution_paths(task, "$HOME", ctx.workdir))
        return ["sh", "-c", script]

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {"FORGE_MCP_URL": ctx.tools_url, "FORGE_MCP_TOKEN": ctx.tools_token} if ctx.tools_url else {}

    async def outcome(self, result: ExecResult, sandbox: Sandbox) -> HarnessOutcome:
        return await answer_file_outcome(result, sandbox, name=self.name)


def _benchmark_scored(task: TaskSpec) -> bool:
    """Whether the task's reward is a benchmark's own formula that credits a clean idle run (ClawEval's task
    score gives one its robustness share, 0.2): there a hostile answer must gain nothing over an idle agent."""
    return kind_of(task).idle_run_credited(task)


async def check_solutions(store: Store, config: ForgeConfig, tasks: Sequence[TaskSpec]) -> list[TaskProblem]:
    """Every task whose graders fail its reference solution or give credit to a hostile answer or an idle
    agent. A task with no reference (`unchecked`) still meets the hostile answers and an idle agent."""
    with_solution = [t for t in tasks if t.solution]
    problems: list[TaskProblem] = []
    run = store.create_run(kind="check", name="tasks validate --run")
    store.set_run_status(run.id, "running")
    solved = _StandInHarness({t.id: t.solution or "true" for t in with_solution},
                             solutions={t.id: t for t in with_solution if t.solution_files})
    # The idle agent before the hostile answers: under a benchmark's own formula its score is their floor.
    idle = [t for t in tasks if not t.solution or _benchmark_scored(t)]
    attempts = [("solved", solved, with_solution), ("idle agent", _StandInHarness({}), idle)]
    attempts += [(label, _StandInHarness({}, {t.id: make(t) for t in tasks}), list(tasks))
                 for label, make in HOSTILE_ANSWERS.items()]
    family: dict[str, list[tuple[TaskSpec, str]]] = {}  # a family's own hostile agents: label -> (task, script)
    for task in tasks:
        for label, script in kind_of(task).attacks(task).items():
            family.setdefault(label, []).append((task, script))
    attempts += [(label, _StandInHarness({t.id: script for t, script in tried}), [t for t, _ in tried])
                 for label, tried in family.items()]
    recorded = [t for t in tasks if t.judge is None and any(not r.absent for r in t.expect_requests)]
    if recorded:
        attempts.append(("forged dispatch", _StandInHarness({t.id: forged_dispatch(t) for t in recorded}), recorded))
    credited: dict[str, list[str]] = {}  # task id -> the hostile answers it gave credit to
    floor: dict[str, float] = {}  # task id -> an idle agent's score under a benchmark's own formula
    for step, (label, harness, tried) in enumerate(attempts):
        if not tried:
            continue
        runner = RolloutRunner(store, config=config, proxy_url="http://127.0.0.1:9", harness=harness)
        out = await runner.run(run.id, [RolloutSpec(t) for t in tried], step=step)
        for task, ro in zip(tried, out):
            if ro.status != "scored":
                problems.append(TaskProblem(WHERE, task.id, f"{label} attempt ended {ro.status}: {ro.error}"))
            elif label == "solved" and (ro.reward or 0.0) < task.pass_threshold:
                offline = offline_failure(ro.verifier_output or "")  # the cause, however far from the last line
                why = f"the tests reached for the network, offline: {offline}" if offline else _last(ro.verifier_output)
                problems.append(TaskProblem(WHERE, task.id, f"the reference solution scores {ro.reward:g} < "
                                            f"pass_threshold {task.pass_threshold:g}: {why}"))
            elif label == "idle agent" and _benchmark_scored(task):
                floor[task.id] = ro.reward or 0.0
                if floor[task.id] >= task.pass_threshold:
                    problems.append(TaskProblem(WHERE, task.id, f"an idle agent passes: {ro.reward:g} >= "
                                                f"pass_threshold {task.pass_threshold:g}"))
            elif label != "solved" and (ro.reward or 0.0) > floor.get(task.id, 0.0):
                over = f" > an idle agent's {floor[task.id]:g}" if task.id in floor else ""
                credited.setdefault(task.id, []).append(f"{label} {ro.reward:g}{over}")
    problems += [TaskProblem(WHERE, tid, f"gives credit to hostile answers (must be 0): {', '.join(got)}")
                 for tid, got in credited.items()]
    store.set_run_status(run.id, "finished")
    return problems


def unchecked_note(tasks: Sequence[TaskSpec]) -> str | None:
    """The line `validate --run` prints for the tasks with no reference solution (ClawEval's is prose): not
    a failure, but nothing proves their graders can pass."""
    ids = [t.id for t in tasks if not t.solution]
    if not ids:
        return None
    shown = ", ".join(ids[:5]) + (f", ... ({len(ids) - 5} more)" if len(ids) > 5 else "")
    return f"no reference to check: {len(ids)} task(s) ({shown}): the hostile answers and an idle agent ran on them"


def _last(output: str | None) -> str:
    lines = [ln for ln in (output or "").splitlines() if ln.strip()]
    return lines[-1][:120] if lines else "(no verifier output)"
