"""Which rollouts failed, and why: how the runner judges a harness's ending (`judge_outcome`), and
what the trainer (a step with nothing to learn from), evals, `forge show` and the veRL agent loop read
of it, none of which needs the others to ask.

A failure is the policy's (scored 0, kept) or not (an infrastructure or harness failure: masked, and
counted wherever a figure leaves it out). docs/harnesses.md, "How a rollout ends", has the classes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Sequence

from openforge.errors import TrainerError
from openforge.rollouts.harnesses.base import HarnessOutcome
from openforge.store import Call, Rollout

MAX_SIGNAL = 64  # exit codes 129..192 are 128 + a signal's number (sandbox/base.py ExecResult)


def judge_outcome(outcome: HarnessOutcome, *, harness: str, exit_code: int, calls_model: bool, answered: bool,
                  last_call: Call | None) -> HarnessOutcome:
    """The harness's own outcome, checked against what the policy cannot write: the exit code the
    sandbox saw and the proxy's record of the rollout's calls (`answered`: any call ended ok;
    `last_call`: the newest). Called once the harness has exited within its time limit, and after a
    last call that failed in the engine or the proxy has already made the rollout an infra failure.

    - No model call was ever answered: the policy did nothing, so nothing of its ended the run. An
      answer, or a policy failure (a first prompt over the context), is a harness failure.
    - A harness failure with exit code 128+N: a signal killed the harness, and the runner sent none
      (a timeout ends the rollout before). In a sandbox only the agent's processes send signals (or the
      kernel, for memory they took): the agent killed its harness, the policy's failure.
    - A harness failure right after the policy's last call was cut at the output cap (the proxy
      recorded finish_reason "length"): the policy rambled until the harness gave up.
    - Any other harness failure once the proxy answered every call it got: no fault of the machinery
      is on record, and the policy could have caused it (its commands can kill the in-sandbox
      forwarder, remove the harness's files, or drive it into an error it gives up on). The policy's
      failure: masking it would let a policy escape its 0 by breaking its harness.
    """
    if calls_model and not answered:
        if outcome.answer is not None:
            return HarnessOutcome.failed(f"{harness} made no successful model call (exit code {exit_code})")
        return HarnessOutcome.failed(outcome.failure or outcome.policy_failure or "", turns=outcome.turns)
    if outcome.failure is None:
        return outcome
    if 128 < exit_code <= 128 + MAX_SIGNAL:
        return HarnessOutcome.policy_failed(f"{harness} was killed by signal {exit_code - 128}, not by the runner "
                                            f"({outcome.failure})", turns=outcome.turns)
    if last_call is not None and last_call.status == "ok" and last_call.finish_reason == "length":
        return HarnessOutcome.policy_failed(f"the policy's last call was cut at the output cap, then "
                                            f"{outcome.failure}", turns=outcome.turns)
    if calls_model:
        return HarnessOutcome.policy_failed(f"{outcome.failure} (after the model's calls, no engine or proxy "
                                            "fault recorded)", turns=outcome.turns)
    return outcome


PROMPT_FIX = ("shrink it with the spec's [prompt] table (docs/harnesses.md), or serve a longer context "
              "(proxy.max_context_tokens, the engine's context length)")


def prompt_misfit(harness: str, calls: Sequence[Call]) -> str | None:
    """Why the harness's own prompt cannot run under these settings, or None: a main call (not a side
    call its spec names) refused as over the context while it held no answer of the policy's (proxy/
    pipeline.py records `refused` and `policy_turns`). Its text is the harness's and the task's only,
    so the 0 would be the run's configuration's, not the policy's; a prompt the policy filled with its
    turns is the policy's (the harness's ending says how: a turn limit, a failure, compaction)."""
    misfit = next((c for c in calls if c.status == "refused" and c.policy_turns == 0 and c.side is None), None)
    if misfit is None:
        return None
    return _does_not_fit(harness, f"{misfit.error}", calls)


def context_full_misfit(harness: str, outcome: HarnessOutcome, calls: Sequence[Call]) -> str | None:
    """The same when the harness itself refused to send its prompt (it was told the run's context: Claude
    Code's `blocking_limit`), so the proxy saw no call to refuse: a configuration failure while no main call
    was answered (the policy had written nothing yet), else None (a conversation the policy grew is its own)."""
    if not outcome.context_full or any(c.status == "ok" and c.side is None for c in calls):
        return None
    return _does_not_fit(harness, f"{harness}: {outcome.policy_failure or outcome.failure or 'its context is full'}",
                         calls)


def _does_not_fit(harness: str, why: str, calls: Sequence[Call]) -> str:
    answered = sum(1 for c in calls if c.status == "ok" and c.side is None)
    return f"{harness}'s own prompt does not fit the context: {PROMPT_FIX} ({why}; {answered} main call(s) answered)"


class PromptDoesNotFit(TrainerError):
    """Most rollouts of a step failed because the harness's own prompt is over the context: every step
    would do the same, and a run of them trains nothing."""

    @classmethod
    def check(cls, what: str, rollouts: Sequence[Rollout]) -> None:
        """Raise when more than half of `rollouts` are configuration failures."""
        misfits = [r for r in rollouts if r.failure_kind == "config"]
        if misfits and 2 * len(misfits) > len(rollouts):
            reason = failure_reasons(misfits, which=lambda r: True)[0][0].removeprefix("config: ")
            raise cls(f"{len(misfits)} of {len(rollouts)} rollouts of {what} failed before the policy could act: "
                      f"{reason}")


def failure_fields(kind: str, reason: str) -> dict[str, str]:
    """The fields of a rollout that ended without an answer: failure_kind (FAILURE_KINDS) and the error."""
    return {"error": f"{kind}: {reason}", "failure_kind": kind}


def is_infra_failure(rollout: Rollout) -> bool:
    """Failed for a reason that is not the policy's: the sandbox, the engine, the harness itself, the
    run's settings (a harness prompt over the context). (A row without a failure kind predates them:
    the runner marked only those `failed`.)"""
    if rollout.failure_kind is not None:
        return rollout.failure_kind in ("infra", "harness", "config")
    return rollout.status == "failed"


def is_failure(rollout: Rollout) -> bool:
    """Ended without an answer graded: failed (any kind), timed out, or stopped on the policy's failure."""
    return rollout.failure_kind is not None or rollout.status in ("failed", "timed_out")


def count_infra_failures(rollouts: Sequence[Rollout]) -> int:
    return sum(1 for r in rollouts if is_infra_failure(r))


def infra_note(n: int) -> str:
    """What a figure leaves out, said beside it: "3 infra failures excluded" (or "no infra failures")."""
    return f"{n} infra failure{'' if n == 1 else 's'} excluded" if n else "no infra failures"


def failure_reasons(rollouts: Sequence[Rollout], *, which: Callable[[Rollout], bool] = is_infra_failure
                    ) -> list[tuple[str, int]]:
    """The reasons of the failures among `rollouts` (by default the infra/harness ones), most frequent
    first. A reason is the first line of the rollout's error."""
    counts = Counter(((r.error or "").strip().splitlines() or ["no reason recorded"])[0][:300]
                     for r in rollouts if which(r))
    return counts.most_common()


class StepFailed(TrainerError):
    """Every rollout of a step failed for infrastructure or harness reasons: there is nothing to learn
    from, and the next step would fail the same way."""

    def __init__(self, what: str, n: int, reason: str, count: int) -> None:
        self.n, self.reason, self.count = n, reason, count
        super().__init__(f"every rollout of {what} failed ({n}); the most frequent reason ({count} of {n}): {reason}")

    @classmethod
    def check(cls, what: str, rollouts: Sequence[Rollout]) -> None:
        """Raise when `rollouts` is not empty and every one of them is an infra/harness failure."""
        if rollouts and all(is_infra_failure(r) for r in rollouts):
            reason, count = failure_reasons(rollouts)[0]
            raise cls(what, len(rollouts), reason, count)
