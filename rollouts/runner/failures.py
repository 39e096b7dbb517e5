"""Which rollouts failed, and why: read by the trainer (a step with nothing to learn from), evals,
`forge show` and the veRL agent loop, none of which needs the others to ask."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Sequence

from openforge.errors import TrainerError
from openforge.store import Rollout


def is_infra_failure(rollout: Rollout) -> bool:
    """Failed for a reason that is not the policy's: the sandbox, the engine, the harness itself.
    (A row without a failure kind predates them: the runner marked only those `failed`.)"""
    if rollout.failure_kind is not None:
        return rollout.failure_kind in ("infra", "harness")
    return rollout.status == "failed"


def is_failure(rollout: Rollout) -> bool:
    """Ended without being scored normally: failed (any kind) or timed out."""
    return rollout.failure_kind is not None or rollout.status in ("failed", "timed_out")


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
