"""`forge analyze`: behaviour metrics of runs, grouped by harness, step or task, with bootstrap CIs.

    report = analyze(store, ["run-a", "run-b"], by="harness")
    report.groups        one row per harness / step / task: n, pass@k, pass^k, each metric's mean + CI
    report.changes       for `harness` and `step`: each later group against the first, mean change + CI

Only the policy's own outcomes are samples (rollouts `scored` or `timed_out`, as in pass@k):
a rollout that failed for infrastructure or harness reasons says nothing about the policy's
behaviour. For `--by step`, `first_steps`/`last_steps` pool the first and last N steps of the runs
into the two groups compared, so a short training run still has enough samples per group.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from statistics import fmean
from typing import Any, Literal

from openforge.errors import ConfigError
from openforge.store import Store
from openforge.rollouts.analysis.behaviour import Behaviour, behaviour_of
from openforge.rollouts.runner.metrics import DATA_STATES, pass_at_k, pass_hat_k
from openforge.rollouts.runner.transcript import transcript_of

GroupBy = Literal["harness", "step", "task"]
METRICS = ("turns", "tool_calls", "tool_coverage", "self_verified", "error_recovery", "plan_completion",
           "gave_up", "prefix_breaks", "tokens_per_turn", "reward")
BOOTSTRAP_RESAMPLES = 2000


@dataclass
class Estimate:
    mean: float | None
    lo: float | None  # 95% percentile-bootstrap interval
    hi: float | None
    n: int  # rollouts for which the metric is defined


@dataclass
class Group:
    key: str
    n_rollouts: int
    pass_at: dict[str, float | None]
    pass_hat: dict[str, float | None]
    metrics: dict[str, Estimate]
    break_reasons: dict[str, int] = field(default_factory=dict)  # reason -> prefix breaks, most frequent first


@dataclass
class Change:
    base: str
    other: str
    metrics: dict[str, Estimate]  # mean = other - base


@dataclass
class Report:
    runs: list[str]
    by: str
    groups: list[Group]
    changes: list[Change] = field(default_factory=list)
    rollouts: list[Behaviour] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["rollouts"] = [b.to_json() for b in self.rollouts]
        return out


def _percentile(sorted_values: list[float], q: float) -> float:
    idx = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[idx]


def bootstrap_mean(values: Sequence[float], *, seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES) -> Estimate:
    """Mean and 95% percentile-bootstrap interval. One value gives a zero-width interval.

    E.g. [0, 1, 1, 1]: mean 0.75, interval within [0, 1]."""
    if not values:
        return Estimate(None, None, None, 0)
    rng = random.Random(seed)
    n = len(values)
    means = sorted(fmean(rng.choices(values, k=n)) for _ in range(resamples))
    return Estimate(fmean(values), _percentile(means, 0.025), _percentile(means, 0.975), n)


def bootstrap_change(base: Sequence[float], other: Sequence[float], *, seed: int = 0,
                     resamples: int = BOOTSTRAP_RESAMPLES) -> Estimate:
    """mean(other) - mean(base), each group resampled independently, with its 95% interval."""
    if not base or not other:
        return Estimate(None, None, None, 0)
    rng = random.Random(seed)
    deltas = sorted(fmean(rng.choices(other, k=len(other))) - fmean(rng.choices(base, k=len(base)))
                    for _ in range(resamples))
    return Estimate(fmean(other) - fmean(base), _percentile(deltas, 0.025), _percentile(deltas, 0.975),
                    min(len(base), len(other)))


def _values(rows: Sequence[Behaviour], metric: str) -> list[float]:
    return [float(v) for b in rows if (v := getattr(b, metric)) is not None]


def rollout_behaviours(store: Store, run_ids: Sequence[str]) -> list[Behaviour]:
    """Every sampled rollout's behaviour in these runs."""
    out: list[Behaviour] = []
    for run_id in run_ids:
        tasks = {t.task_id: (t.spec_json or {}) for t in store.list_tasks(run_id)}
        calls: dict[str, list[Any]] = {}
        for call in store.list_calls(run_id=run_id):
            calls.setdefault(call.rollout_id, []).append(call)
        for ro in store.list_rollouts(run_id):
            if ro.status in DATA_STATES:
                out.append(behaviour_of(ro, transcript_of(calls.get(ro.id, [])), tasks.get(ro.task_id, {})))
    return out


def _pass_rates(rows: Sequence[Behaviour], k_values: Sequence[int]) -> tuple[dict[str, float | None], ...]:
    """pass@k and pass^k of these rollouts: per task (unbiased estimators), then the mean over tasks."""
    by_task: dict[str, list[Behaviour]] = {}
    for b in rows:
        by_task.setdefault(b.task_id, []).append(b)
    at: dict[str, float | None] = {}
    hat: dict[str, float | None] = {}
    for k in k_values:
        per_at, per_hat = [], []
        for bs in by_task.values():
            n, c = len(bs), sum(1 for b in bs if b.passed)
            if k <= n:
                per_at.append(pass_at_k(n, c, k))
                per_hat.append(pass_hat_k(n, c, k))
        at[str(k)] = fmean(per_at) if per_at else None
        hat[str(k)] = fmean(per_hat) if per_hat else None
    return at, hat


def _group(rows: Sequence[Behaviour], key: str, k_values: Sequence[int]) -> Group:
    at, hat = _pass_rates(rows, k_values)
    reasons = Counter(r for b in rows for r in b.break_reasons)
    return Group(key=key, n_rollouts=len(rows), pass_at=at, pass_hat=hat,
                 metrics={m: bootstrap_mean(_values(rows, m)) for m in METRICS},
                 break_reasons=dict(reasons.most_common()))


def _keyed(rows: Sequence[Behaviour], by: GroupBy, first_steps: int, last_steps: int
           ) -> list[tuple[str, list[Behaviour]]]:
    key_of: Callable[[Behaviour], str]
    if by == "step":
        steps = sorted({b.step for b in rows})
        if len(steps) < 2:
            return [(f"step {s}", [b for b in rows if b.step == s]) for s in steps]
        first, last = steps[:first_steps], steps[-last_steps:]
        if set(first) & set(last):
            first, last = steps[:len(steps) // 2], steps[len(steps) // 2:]
        name = lambda ss: f"step {ss[0]}" if len(ss) == 1 else f"steps {ss[0]}-{ss[-1]}"  # noqa: E731
        return [(name(first), [b for b in rows if b.step in first]),
                (name(last), [b for b in rows if b.step in last])]
    key_of = (lambda b: b.harness or "?") if by == "harness" else (lambda b: b.task_id)
    groups: dict[str, list[Behaviour]] = {}
    for b in rows:
        groups.setdefault(key_of(b), []).append(b)
    return sorted(groups.items())


def analyze(store: Store, run_ids: Sequence[str], *, by: GroupBy = "step", k_values: Sequence[int] = (1, 3),
            first_steps: int = 1, last_steps: int = 1) -> Report:
    if by not in ("harness", "step", "task"):
        raise ConfigError(f"--by must be harness, step or task, not {by!r}")
    if first_steps < 1 or last_steps < 1:
        raise ConfigError("--first and --last must be at least 1 step")
    rows = rollout_behaviours(store, run_ids)
    keyed = _keyed(rows, by, first_steps, last_steps)
    groups = [_group(rs, key, k_values) for key, rs in keyed]
    changes = []
    if by in ("harness", "step") and len(keyed) >= 2:
        base_key, base_rows = keyed[0]
        for key, rs in keyed[1:]:
            changes.append(Change(base=base_key, other=key,
                                  metrics={m: bootstrap_change(_values(base_rows, m), _values(rs, m)) for m in METRICS}))
    return Report(runs=list(run_ids), by=by, groups=groups, changes=changes, rollouts=rows)


OVER_STEPS = ("self_verified", "tool_calls", "error_recovery", "gave_up")


def behaviour_over_steps(store: Store, run_id: str, *, metrics: Sequence[str] = OVER_STEPS
                         ) -> list[tuple[int, int, dict[str, float | None]]]:
    """(step, rollouts, metric -> mean) for each step of a run: the dashboard's behaviour panel."""
    by_step: dict[int, list[Behaviour]] = {}
    for b in rollout_behaviours(store, [run_id]):
        by_step.setdefault(b.step, []).append(b)
    return [(step, len(rows), {m: (fmean(v) if (v := _values(rows, m)) else None) for m in metrics})
            for step, rows in sorted(by_step.items())]
