"""The rollout runner on the real local sandbox, with small shell-command harnesses.

A `ShellHarness` is a real adapter (it satisfies the Harness protocol and runs a real command in the
sandbox); only the agent is replaced by a shell line, so each test pins one runner behaviour."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from openforge.errors import SandboxError
from openforge.store import Store, hash_key
from openforge.rollouts.harnesses.base import HarnessContext, HarnessOutcome
from openforge.rollouts.runner.runner import RolloutSpec
from openforge.sandbox.base import Sandbox, TransientSandboxError
from openforge.sandbox.factory import make_sandbox
from openforge.sandbox.local import SANDBOX_ENV
from openforge.sandbox.procs import marked_pids
from tests.helpers.runner import Reporting, ShellHarness, _config, _runner, _task


def _gone(forge_home: Path, rollout_id: str) -> bool:
    return not (forge_home / "sandboxes" / rollout_id).exists() and not marked_pids(SANDBOX_ENV, rollout_id)


async def test_scored_rollout_stores_output_and_verifier(store: Store, forge_home: Path) -> None:
    run = store.create_run(kind="eval")
    harness = ShellHarness('echo "key=$OPENAI_API_KEY"; echo oops >&2; cat task.txt > done.txt')
    task = _task(files={"task.txt": "hi\n"}, verifier="cat done.txt; echo 'score: 0.75'")
    [ro] = await _runner(store, harness).run(run.id, [RolloutSpec(task, 0)], step=2, adapter="step-1")
    assert (ro.status, ro.reward, ro.exit_code, ro.step, ro.adapter) == ("scored", 0.75, 0, 2, "step-1")
    assert hash_key(ro.stdout.strip().removeprefix("key=")) == ro.key_hash and ro.stderr.strip() == "oops"
    assert "hi" in ro.verifier_output and ro.attempts == 1 and ro.error is None
    assert ro.started_at is not None and ro.ended_at is not None
    assert [hash_key(k) for k in harness.prepared] == [ro.key_hash]
    assert [t.task_id for t in store.list_tasks(run.id)] == ["t"]
    assert _gone(forge_home, ro.id)


@pytest.mark.parametrize(("verifier", "reward", "note"), [
    ("exit 0", 1.0, None),
    ("exit 1", 0.0, None),
    ("echo 'score: 0.3'; exit 1", 0.0, None),  # a failing verifier gives nothing
    ("echo 0.5", 0.5, None),
    ("echo 'score: 7'", 0.0, "outside [0, 1]"),
])
async def test_verifier_score_forms(store: Store, verifier: str, reward: float, note: str | None) -> None:
    run = store.create_run()
    [ro] = await _runner(store, ShellHarness("true")).run(run.id, [RolloutSpec(_task(verifier=verifier))])
    assert ro.status == "scored" and ro.reward == pytest.approx(reward)
    assert (ro.error is None) if note is None else (note in ro.error)


async def test_hanging_harness_is_killed_at_its_limit_and_its_sandbox_is_gone(store: Store, forge_home: Path) -> None:
    run = store.create_run()
    # The harness leaves a grandchild behind too: the kill must take the whole tree.
    harness = ShellHarness("(sleep 300 &) ; echo started; sleep 300")
    t0 = time.monotonic()
    [ro] = await _runner(store, harness).run(run.id, [RolloutSpec(_task(time_limit_s=1.0))])
    assert time.monotonic() - t0 < 8
    assert (ro.status, ro.reward, ro.exit_code, ro.failure_kind) == ("timed_out", 0.0, 124, "timeout")
    assert "limit of 1s" in ro.error and "started" in ro.stdout
    assert _gone(forge_home, ro.id)


class FlakyFactory:
    """Real local sandboxes whose first `failures` starts fail the way a busy engine does."""

    def __init__(self, failures: int, exc: type[SandboxError] = TransientSandboxError) -> None:
        self.failures, self.exc, self.starts = failures, exc, 0

    def __call__(self, config, *, run_id: str, rollout_id: str) -> Sandbox:  # noqa: ANN001
        sb = make_sandbox(config, run_id=run_id, rollout_id=rollout_id)
        real_start = sb.start

        async def start() -> None:
            self.starts += 1
            if self.starts <= self.failures:
                raise self.exc(f"engine busy (start {self.starts})")
            await real_start()

        sb.start = start  # type: ignore[method-assign]
        return sb


async def test_infra_retry_then_success_and_agent_failure_is_data(store: Store) -> None:
    run = store.create_run()
    factory = FlakyFactory(failures=2)
    runner = _runner(store, ShellHarness("true"), sandbox_factory=factory)  # the agent did nothing: data
    [ro] = await runner.run(run.id, [RolloutSpec(_task())])
    assert (ro.status, ro.reward, ro.attempts, ro.exit_code) == ("scored", 0.0, 3, 0)


async def test_infra_failure_after_retries_is_failed_not_scored(store: Store) -> None:
    run = store.create_run()
    runner = _runner(store, ShellHarness("touch done.txt"), sandbox_factory=FlakyFactory(failures=99))
    [ro] = await runner.run(run.id, [RolloutSpec(_task())])
    assert (ro.status, ro.reward, ro.attempts) == ("failed", None, 3)
    assert ro.error.startswith("infra: sandbox failed to start after 3 attempt(s): engine busy (start 3)")
    assert ro.failure_kind == "infra"


async def test_permanent_start_failure_is_not_retried(store: Store) -> None:
    run = store.create_run()
    factory = FlakyFactory(failures=99, exc=SandboxError)
    [ro] = await _runner(store, ShellHarness("true"), sandbox_factory=factory).run(run.id, [RolloutSpec(_task())])
    assert (ro.status, ro.attempts, factory.starts) == ("failed", 1, 1)


async def test_failing_setup_is_infra(store: Store) -> None:
    run = store.create_run()
    [ro] = await _runner(store, ShellHarness("true")).run(run.id, [RolloutSpec(_task(setup="echo no >&2; exit 2"))])
    assert ro.status == "failed" and "setup exited 2" in ro.error and "no" in ro.error


async def test_concurrency_is_bounded_and_progress_reported(store: Store) -> None:
    run = store.create_run()
    running: set[str] = set()
    peak = 0
    seen: list[str] = []

    def progress(r) -> None:  # noqa: ANN001
        nonlocal peak
        seen.append(r.status)
        (running.add if r.status == "running" else running.discard)(r.id)
        peak = max(peak, len(running))

    runner = _runner(store, ShellHarness("sleep 0.3; touch done.txt"), config=_config(concurrency=2),
                     on_progress=progress)
    out = await runner.run(run.id, [RolloutSpec(_task(), i) for i in range(5)])
    assert [r.sample_index for r in out] == list(range(5))
    assert all(r.status == "scored" and r.reward == 1.0 for r in out)
    assert peak == 2 and seen.count("running") == 5 and seen.count("scored") == 5


async def test_pause_holds_new_rollouts_until_resume(store: Store) -> None:
    run = store.create_run()
    runner = _runner(store, ShellHarness("touch done.txt"))
    runner.pause()
    job = asyncio.create_task(runner.run(run.id, [RolloutSpec(_task(), i) for i in range(2)]))
    await asyncio.sleep(0.5)
    assert runner.paused and {r.status for r in store.list_rollouts(run.id)} == {"pending"}
    runner.resume()
    out = await asyncio.wait_for(job, 20)
    assert [r.status for r in out] == ["scored", "scored"]


async def test_cancel_marks_every_rollout_and_cleans_every_sandbox(store: Store, forge_home: Path) -> None:
    run = store.create_run()
    runner = _runner(store, ShellHarness("sleep 300"), config=_config(concurrency=2))
    job = asyncio.create_task(runner.run(run.id, [RolloutSpec(_task(), i) for i in range(3)]))
    for _ in range(100):
        await asyncio.sleep(0.05)
        if sum(r.status == "running" for r in store.list_rollouts(run.id)) == 2:
            break
    await asyncio.sleep(0.3)  # let both harnesses start inside their sandboxes
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    rollouts = store.list_rollouts(run.id)
    assert [r.status for r in rollouts] == ["cancelled"] * 3
    assert all(_gone(forge_home, r.id) for r in rollouts)
    assert not list((forge_home / "sandboxes").iterdir())


def _answer_task():  # noqa: ANN202
    from openforge.rollouts.tasks.format import load_tasks

    return next(t for t in load_tasks("builtin") if t.id == "easy-say-hello")


async def test_the_harness_reported_answer_is_graded_not_a_file_the_agent_wrote(store: Store) -> None:
    run = store.create_run()
    writes = "mkdir -p .forge; echo hello world > .forge/answer.txt"
    [ro] = await _runner(store, Reporting(writes, HarnessOutcome(answer="hello"))).run(run.id, [RolloutSpec(_answer_task())])
    assert (ro.status, ro.reward) == ("scored", 0.0)
    assert "expected the words 'hello world', got 'hello'" in ro.verifier_output
    [ro] = await _runner(store, Reporting("true", HarnessOutcome(answer="Hello, world."))).run(
        run.id, [RolloutSpec(_answer_task())])
    assert (ro.status, ro.reward) == ("scored", 1.0)
    # a shell verifier reads the reported answer from the answer file, which the runner wrote
    task = _task(verifier='[ "$(cat .forge/answer.txt)" = 42 ]')
    [ro] = await _runner(store, Reporting(writes, HarnessOutcome(answer="42"))).run(run.id, [RolloutSpec(task)])
    assert (ro.status, ro.reward) == ("scored", 1.0)


@pytest.mark.parametrize(("harness", "error"), [
    # the case: the harness printed its error JSON, whose text holds "status" and "ok"
    (Reporting('echo \'{"is_error": true, "api_error_status": 400, "result": "status ok"}\'',
               HarnessOutcome.failed("API error 400: prompt is too long")), "harness: API error 400: prompt is too long"),
    (ShellHarness("mkdir -p .forge; echo status ok > .forge/answer.txt; exit 3"), "harness: shell exited 3: "),
    (Reporting("true", HarnessOutcome(answer="status ok"), calls_model=True),
     "harness: shell made no successful model call (exit code 0)"),
])
async def test_a_harness_failure_is_failed_and_never_graded(store: Store, harness: ShellHarness, error: str) -> None:
    from openforge.rollouts.tasks.format import load_tasks

    status_ok = next(t for t in load_tasks("builtin") if t.id == "easy-status-ok")
    run = store.create_run()
    [ro] = await _runner(store, harness).run(run.id, [RolloutSpec(status_ok)])
    assert (ro.status, ro.reward, ro.verifier_output) == ("failed", None, None)
    assert ro.error.startswith(error), ro.error
    assert ro.failure_kind == "harness"


async def test_a_harness_that_cannot_be_prepared_is_infra(store: Store, forge_home: Path) -> None:
    from openforge.errors import HarnessError

    class Missing(ShellHarness):
        async def prepare(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
            raise HarnessError("claude not found in the sandbox; install it with npm")

    run = store.create_run()
    [ro] = await _runner(store, Missing("true")).run(run.id, [RolloutSpec(_task())])
    assert ro.status == "failed" and ro.error == (
        "infra: harness shell could not be prepared: claude not found in the sandbox; install it with npm")
    assert _gone(forge_home, ro.id)

