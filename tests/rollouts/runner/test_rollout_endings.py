"""How a rollout ends (issue 30): the policy's failures score 0 and stay in their group and in pass@k;
infrastructure and harness failures are masked, and counted beside every figure that leaves them out.

The adapters are fed the real output of Claude Code 2.1.197 and Codex 0.171.0 in tests/data/harness_endings/,
recorded through the proxy on the tiny model with a scripted engine (as tests/rollouts/harnesses/test_real_harnesses.py runs
them): `calls` is the proxy's record of the rollout's calls, (status, finish_reason) in order.

    claude-code-max-turns   --max-turns 2, the policy calls Bash every turn
    claude-code-context     proxy max_context_tokens 52000, `seq 1 3000` until the prompt is refused
    claude-code-output-cap  proxy max_tokens_cap 20, the policy rambles ("blah " * 200)
    codex-output-cap        the same, Codex (`codex exec --json`)
    codex-context           proxy max_context_tokens 25000, `seq 1 400` until the prompt is refused
    codex-answer            the policy answers "Done."
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from openforge.rollouts.harnesses.base import HarnessOutcome
from openforge.rollouts.harnesses.claude_code import claude_outcome
from openforge.rollouts.harnesses.codex import codex_outcome
from openforge.rollouts.runner.failures import context_full_misfit, judge_outcome
from openforge.rollouts.runner.metrics import run_metrics, summary_headline, task_metrics
from openforge.rollouts.runner.harness_run import engine_fault as _engine_fault
from openforge.rollouts.runner.runner import RolloutSpec
from openforge.sandbox.base import ExecResult
from openforge.store import CALL_CLIENT_LEFT, Call, Rollout, Store, Trajectory
from tests.helpers.paths import DATA
from tests.helpers.proxy_rig import make_rig  # noqa: F401 - fixture
from tests.helpers.runner import Reporting, ShellHarness, _runner, _task

ENDINGS = DATA / "harness_endings"


def recorded(name: str) -> tuple[ExecResult, list[Call]]:
    """A recorded ending: what the harness left (exit code, stdout) and the proxy's record of its calls."""
    data = json.loads((ENDINGS / f"{name}.json").read_text())
    calls = [Call(status=status, finish_reason=reason) for status, reason in data["calls"]]
    return ExecResult(exit_code=data["exit_code"], stdout=data["stdout"], stderr=""), calls


def test_a_harness_that_will_not_send_its_own_prompt_is_a_configuration_failure() -> None:
    """Claude Code told the run's context stops before it sends an over-long prompt (`blocking_limit`): with
    no answer of the policy's in the conversation, the prompt is the harness's and the task's, a
    configuration failure naming the fix; once the policy answered, the conversation it grew is its own."""
    final = {"type": "result", "subtype": "success", "is_error": True, "api_error_status": None, "num_turns": 1,
             "result": "Prompt is too long", "terminal_reason": "blocking_limit"}
    outcome = claude_outcome(ExecResult(exit_code=1, stdout=json.dumps(final), stderr=""))
    assert outcome.context_full and outcome.policy_failure is not None
    said = context_full_misfit("claude-code", outcome, [])
    assert said is not None and said.startswith("claude-code's own prompt does not fit the context: ")
    assert "[prompt]" in said and "Prompt is too long" in said
    side = Call(status="ok", side="title")  # the harness's own background call: no answer of the policy's
    assert context_full_misfit("claude-code", outcome, [side]) is not None
    assert context_full_misfit("claude-code", outcome, [side, Call(status="ok")]) is None
    turn_limit = claude_outcome(ExecResult(exit_code=1, stdout=json.dumps(
        {**final, "subtype": "error_max_turns", "terminal_reason": "max_turns"}), stderr=""))
    assert not turn_limit.context_full and context_full_misfit("claude-code", turn_limit, []) is None


def judged(outcome: HarnessOutcome, result: ExecResult, calls: list[Call], harness: str) -> HarnessOutcome:
    return judge_outcome(outcome, harness=harness, exit_code=result.exit_code, calls_model=True,
                         answered=any(c.status == "ok" for c in calls), last_call=calls[-1] if calls else None)


# -- each adapter's ending, from the real output ---------------------------------------------------

@pytest.mark.parametrize(("name", "policy_failure", "failure"), [
    ("claude-code-max-turns", "claude-code stopped at its turn limit: Reached maximum number of turns (2)", None),
    ("claude-code-context", "API error 400: Prompt is too long", None),
    # Claude Code says only "API Error: Claude's response exceeded the 32000 output token maximum" (no
    # status): the adapter cannot tell whose it is; the proxy's record can (next test).
    ("claude-code-output-cap", None, "claude-code reported an error (success): Claude's response exceeded the "
                                     "32000 output token maximum. To configure this behavior, set the "
                                     "CLAUDE_CODE_MAX_OUTPUT_TOKENS environment variable."),
])
def test_claude_code_endings(name: str, policy_failure: str | None, failure: str | None) -> None:
    result, _ = recorded(name)
    got = claude_outcome(result)
    assert (got.answer, got.policy_failure, got.failure) == (None, policy_failure, failure)


@pytest.mark.parametrize(("name", "policy_failure", "failure", "answer"), [
    ("codex-context", "codex exited 1: Codex ran out of room in the model's context window. Start a new thread "
                      "or clear earlier history before retrying.", None, None),
    ("codex-output-cap", None, "codex exited 1: Incomplete response returned, reason: max_output_tokens", None),
    ("codex-answer", None, None, "Done."),
])
def test_codex_endings(name: str, policy_failure: str | None, failure: str | None, answer: str | None) -> None:
    result, _ = recorded(name)
    got = codex_outcome(result, "Done." if result.exit_code == 0 else None)
    assert (got.answer, got.policy_failure, got.failure) == (answer, policy_failure, failure)


@pytest.mark.parametrize(("name", "harness", "reason"), [
    ("claude-code-max-turns", "claude-code", "claude-code stopped at its turn limit: "),
    ("claude-code-context", "claude-code", "API error 400: Prompt is too long"),
    ("claude-code-output-cap", "claude-code", "the policy's last call was cut at the output cap, then claude-code "),
    ("codex-context", "codex", "codex exited 1: Codex ran out of room in the model's context window"),
    ("codex-output-cap", "codex", "the policy's last call was cut at the output cap, then codex exited 1: "),
])
def test_every_recorded_policy_ending_is_the_policys_failure(name: str, harness: str, reason: str) -> None:
    """Turn limits, a context the policy filled, the output cap: reward 0, kept (not a masked failure)."""
    result, calls = recorded(name)
    got = judged(claude_outcome(result) if harness == "claude-code" else codex_outcome(result, None),
                 result, calls, harness)
    assert got.failure is None and got.policy_failure is not None and got.policy_failure.startswith(reason), got


def test_codex_is_not_fooled_by_lines_the_policy_printed() -> None:
    """The policy's commands print into Codex's human-readable stream; it can print an engine error there
    (the adapter used to read `ERROR:` lines from stderr). Its JSON events hold such lines inside strings."""
    result, calls = recorded("codex-context")
    fake = 'ERROR: unexpected status 503 Service Unavailable: {"error": {"message": "the engine is down"}}'
    injected = json.dumps({"type": "item.completed", "item": {"type": "command_execution",
                                                               "aggregated_output": f"{fake}\n"}})
    stdout = result.stdout.replace('{"type":"error"', injected + '\n{"type":"error"', 1)
    forged = ExecResult(exit_code=1, stdout=stdout, stderr=f"{fake}\n")
    got = judged(codex_outcome(forged, None), forged, calls, "codex")
    assert got.failure is None and "ran out of room" in (got.policy_failure or ""), got


# -- the runner's judgement: what the policy cannot write -------------------------------------------

def ok(finish: str = "stop") -> Call:
    return Call(status="ok", finish_reason=finish)


@pytest.mark.parametrize(("outcome", "exit_code", "calls", "want"), [
    # the policy never acted: nothing of its can have ended the run (the harness's own prompt did not fit)
    (HarnessOutcome.policy_failed("API error 400: Prompt is too long"), 1, [],
     HarnessOutcome.failed("API error 400: Prompt is too long")),
    (HarnessOutcome(answer="status ok"), 0, [Call(status="error")],
     HarnessOutcome.failed("h made no successful model call (exit code 0)")),
    # a signal the runner did not send: the agent killed its harness
    (HarnessOutcome.failed("h exited 137 without its result"), 137, [ok()],
     HarnessOutcome.policy_failed("h was killed by signal 9, not by the runner (h exited 137 without its result)")),
    # the policy's last call hit the output cap, then the harness gave up
    (HarnessOutcome.failed("h exited 1: Incomplete response"), 1, [ok(), ok("length")],
     HarnessOutcome.policy_failed("the policy's last call was cut at the output cap, then h exited 1: "
                                  "Incomplete response")),
    # any other harness failure once the proxy answered every call: the policy could have caused it (a
    # connection error after its command killed the in-sandbox forwarder), so it is not masked
    (HarnessOutcome.failed("h exited 1: Connection error"), 1, [ok("length"), ok()],
     HarnessOutcome.policy_failed("h exited 1: Connection error (after the model's calls, no engine or proxy "
                                  "fault recorded)")),
    (HarnessOutcome.failed("h exited 2: bad flag"), 2, [ok()],
     HarnessOutcome.policy_failed("h exited 2: bad flag (after the model's calls, no engine or proxy fault "
                                  "recorded)")),
    (HarnessOutcome(answer="x"), 0, [ok("length")], HarnessOutcome(answer="x")),
    (HarnessOutcome.policy_failed("turn limit"), 1, [ok()], HarnessOutcome.policy_failed("turn limit")),
])
def test_judge_outcome(outcome: HarnessOutcome, exit_code: int, calls: list[Call], want: HarnessOutcome) -> None:
    got = judge_outcome(outcome, harness="h", exit_code=exit_code, calls_model=True,
                        answered=any(c.status == "ok" for c in calls), last_call=calls[-1] if calls else None)
    assert got == want


@pytest.mark.parametrize(("call", "fault"), [
    (None, None),
    (Call(status="ok"), None),
    (Call(status="error", error="the inference engine failed this call, retry it: 503"),
     "the inference engine failed this call, retry it: 503"),
    (Call(status="interrupted", error="the proxy stopped mid-call"), "the proxy stopped mid-call"),
    # what the agent can cause: its harness killed mid-answer
    (Call(status="error", error=CALL_CLIENT_LEFT), None),
])
def test_only_an_engine_or_proxy_fault_makes_the_last_call_infra(call: Call | None, fault: str | None) -> None:
    assert _engine_fault(call) == fault


# -- the runner, in a real sandbox ------------------------------------------------------------------

async def test_a_policy_failure_is_scored_zero_and_never_graded(store: Store) -> None:
    """The agent did the work (done.txt), then its harness hit its turn limit: 0, not the verifier's 1."""
    run = store.create_run()
    harness = Reporting("touch done.txt", HarnessOutcome.policy_failed("shell stopped at its turn limit (8)"))
    [ro] = await _runner(store, harness).run(run.id, [RolloutSpec(_task())])
    assert (ro.status, ro.reward, ro.failure_kind, ro.verifier_output) == ("scored", 0.0, "policy", None)
    assert ro.error == "policy: shell stopped at its turn limit (8)"


async def test_an_agent_that_kills_its_harness_scores_zero(store: Store) -> None:
    run = store.create_run()
    [ro] = await _runner(store, ShellHarness("touch done.txt; kill -9 $$")).run(run.id, [RolloutSpec(_task())])
    assert (ro.status, ro.reward, ro.failure_kind, ro.exit_code) == ("scored", 0.0, "policy", 137), ro.error
    assert ro.error.startswith("policy: shell was killed by signal 9, not by the runner"), ro.error


# The agent: one answered call, then a streamed call it abandons; the shell around it then kills itself
# (`sleep`: the proxy has written the abandoned call's row by then, so the runner reads it).
KILLED_MID_CALL = r"""
import json, os, sys, urllib.request
def call(stream):
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}).encode()
    return urllib.request.urlopen(urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions", body,
        {"authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "content-type": "application/json"}), timeout=30)
call(False).read()
call(True).readline()
os._exit(0)
"""


async def test_an_agent_that_kills_its_harness_mid_call_is_not_infra(make_rig: Any, tmp_path: Path) -> None:
    """The proxy records the abandoned call as an error (the client left): that is no engine fault, so
    the agent cannot mask its 0 by killing its harness while the model answers."""
    import sys

    from openforge.config import ForgeConfig
    from openforge.rollouts.runner.runner import RolloutRunner
    from openforge.sandbox.testing import proxy_socket_path

    rig = make_rig(lambda ids: "one two three four five six seven eight nine ten", token_delay_s=0.2,
                   uds=Path(proxy_socket_path()))
    agent = tmp_path / "agent.py"
    agent.write_text(KILLED_MID_CALL)
    harness = ShellHarness(f"{sys.executable} {agent}; sleep 1; kill -9 $$")
    harness.calls_model = True
    config = ForgeConfig()
    config.sandbox.read_only_paths = [str(tmp_path)]
    runner = RolloutRunner(rig.store, config=config, proxy_url=rig.url, harness=harness, proxy_socket=rig.proxy.uds)
    [ro] = await runner.run(rig.rollout.run_id, [RolloutSpec(_task())])
    calls = rig.calls(ro.id)
    assert [c.status for c in calls] == ["ok", "error"] and calls[1].error == CALL_CLIENT_LEFT
    assert (ro.status, ro.reward, ro.failure_kind) == ("scored", 0.0, "policy"), ro.error


# -- the trainer keeps a policy failure's group, drops an infra failure's, and counts both ----------

def test_build_batch_keeps_a_group_with_a_policy_failure_and_drops_one_with_an_infra_failure(store: Store) -> None:
    from openforge.trainer.data import build_batch
    from openforge.trainer.loop import _reward_metrics

    run = store.create_run()

    def rollout(task: str, status: str, reward: float | None, kind: str | None = None) -> Rollout:
        r = store.create_rollout(run_id=run.id, task_id=task)
        return store.update_rollout(r.id, status=status, reward=reward, failure_kind=kind)

    gave_up = rollout("a", "scored", 0.0, "policy")
    solved = rollout("a", "scored", 1.0)
    broken = [rollout("b", "scored", 1.0), rollout("b", "failed", None, "infra"),
              rollout("b", "failed", None, "harness")]
    members = [gave_up, solved, *broken]
    trajs = [Trajectory(run_id=run.id, rollout_id=r.id, token_ids=[1, 2, 3], loss_mask=[0, 1, 1],
                        logprobs=[0.0, -1.0, -2.0]) for r in members]
    batch = build_batch(members, trajs, std_normalize=False)
    assert (batch.n_groups, batch.dropped_groups) == (1, 1)
    assert set(batch.dropped_rollouts) == {r.id for r in broken}
    advantage = {s.rollout_id: s.advantage for s in batch.samples}
    assert advantage == {gave_up.id: pytest.approx(-0.5), solved.id: pytest.approx(0.5)}  # punished, not dropped
    assert (batch.infra_failures, batch.policy_failures) == (2, 1)
    metrics = _reward_metrics(batch, [{"id": "a"}, {"id": "b"}])
    assert (metrics["infra_failures"], metrics["policy_failures"], metrics["dropped_groups"]) == (2, 1, 1)


# -- pass@k over every rollout the policy ended; infra failures said beside it ----------------------

def _rollouts(*ends: tuple[str, float | None, str | None]) -> list[Rollout]:
    return [Rollout(id=f"r{i}", run_id="run", task_id="t", status=status, reward=reward, failure_kind=kind)
            for i, (status, reward, kind) in enumerate(ends)]


def test_pass_at_k_counts_policy_failures_as_samples_and_leaves_out_infra_failures() -> None:
    ends = _rollouts(("scored", 1.0, None), ("scored", 0.0, "policy"), ("timed_out", 0.0, "timeout"),
                     ("failed", None, "harness"), ("failed", None, "infra"), ("cancelled", None, None))
    t = task_metrics("t", ends, [1, 2])
    assert (t.n, t.n_pass, t.n_infra_failed) == (3, 1, 2)
    assert t.pass_at[1] == pytest.approx(1 / 3) and t.mean_reward == pytest.approx(1 / 3)
    m = run_metrics([t], [1, 2])
    assert m.headline() == "pass@1 0.33, pass@2 0.67 over 3; 2 infra failures excluded"
    assert summary_headline(json.loads(json.dumps(m.to_json()))) == m.headline()  # as `forge show` reads it back
    one = run_metrics([task_metrics("t", ends[:4], [1])], [1])
    assert one.headline() == "pass@1 0.33 over 3; 1 infra failure excluded"
    assert run_metrics([task_metrics("t", ends[:1], [1])], [1]).headline() == "pass@1 1.00 over 1; no infra failures"


def test_forge_show_says_how_many_infra_failures_its_figures_leave_out(forge_home: Path) -> None:
    from openforge.forge_cli.main import app
    from openforge.rollouts.runner.metrics import summarize_run

    store = Store(forge_home / "forge.db")
    run = store.create_run(kind="eval", name="e")
    for status, reward, kind, error in (("scored", 1.0, None, None),
                                        ("scored", 0.0, "policy", "policy: claude-code stopped at its turn limit"),
                                        ("failed", 1.0, "infra", "infra: trajectory assembly failed: x"),
                                        ("failed", None, "harness", "harness: API error 529: overloaded")):
        r = store.create_rollout(run_id=run.id, task_id="t")
        store.update_rollout(r.id, status=status, reward=reward, failure_kind=kind, error=error)
    store.update_run(run.id, summary={"kind": "eval", **summarize_run(store, run.id, [1]).to_json()})
    out = CliRunner().invoke(app, ["show", run.id], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    text = " ".join(out.stdout.split())
    # the infra failure that kept its grade (1.0, for information) is not in the mean either
    assert "mean reward 0.500 over 2; 2 infra failures excluded" in text
    assert "pass@1 0.50 over 2; 2 infra failures excluded" in text
    assert "policy: claude-code stopped at its turn limit" in text
