"""Rollout metrics: mean reward, pass@k and pass^k per task and per run, tokens, calls, wall time.

With n samples of a task of which c pass, the unbiased estimators (Chen et al. 2021 for pass@k;
tau-bench's pass^k) are

    pass@k = 1 - C(n-c, k) / C(n, k)     P(at least one of k fresh samples passes)
    pass^k = C(c, k) / C(n, k)           P(all k fresh samples pass)

Both are defined for k <= n only. A run's figure is the mean over its tasks. Every rollout the policy
ended is a sample: graded answers, timeouts, and the harness stopping on the policy's own failure (its
turn limit, a context it filled: scored 0). Rollouts that failed for infrastructure or harness reasons
(status `failed`) are not samples of the policy: they are left out of n and counted apart, and every
figure is printed with that count beside it (`RunMetrics.headline`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from math import comb
from statistics import fmean
from typing import Any

from openforge.rollouts.runner.failures import infra_note, is_infra_failure
from openforge.store import Rollout, Store

DATA_STATES = ("scored", "timed_out")  # the policy's own outcomes (a timeout is the agent's failure)


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k)/C(n, k). E.g. n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7."""
    _check(n, c, k)
    if n - c < k:  # every draw of k contains a pass
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """C(c, k)/C(n, k). E.g. n=5, c=3, k=2: C(3,2)/C(5,2) = 3/10 = 0.3."""
    _check(n, c, k)
    return comb(c, k) / comb(n, k)


def _check(n: int, c: int, k: int) -> None:
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n} c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n samples, got k={k} n={n}")


@dataclass
class TaskMetrics:
    task_id: str
    n: int  # samples (scored or timed out)
    n_pass: int
    n_infra_failed: int
    mean_reward: float | None
    pass_at: dict[int, float | None] = field(default_factory=dict)  # k -> pass@k (None: k > n)
    pass_hat: dict[int, float | None] = field(default_factory=dict)
    calls: int = 0
    tokens: int = 0  # prompt + completion tokens over every call
    wall_s: float = 0.0  # summed rollout wall time


@dataclass
class RunMetrics:
    tasks: list[TaskMetrics]
    k_values: list[int]
    n_rollouts: int
    n_infra_failed: int
    mean_reward: float | None  # mean over tasks of their mean reward
    pass_at: dict[int, float | None]
    pass_hat: dict[int, float | None]
    calls: int
    tokens: int
    wall_s: float

    def headline(self) -> str:
        """The run's figures with what they leave out, e.g. "pass@1 0.42 over 96; 3 infra failures excluded"."""
        return headline(self.pass_at, self.n_rollouts - self.n_infra_failed, self.n_infra_failed)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready (the int keys of pass@k become strings), for Run.summary_json."""
        out = asdict(self)
        for row in [out, *out["tasks"]]:
            row["pass_at"] = {str(k): v for k, v in row["pass_at"].items()}
            row["pass_hat"] = {str(k): v for k, v in row["pass_hat"].items()}
        return out


def headline(pass_at: dict[Any, float | None], n_samples: int, n_infra_failed: int) -> str:
    """pass@k of a run (k as int or, read back from a summary, str) over its samples, and the infra
    failures it leaves out: never silently."""
    figures = ", ".join(f"pass@{k} {'-' if v is None else f'{v:.2f}'}" for k, v in pass_at.items()) or "no pass@k"
    return f"{figures} over {n_samples}; {infra_note(n_infra_failed)}"


def summary_headline(summary: dict[str, Any]) -> str | None:
    """`headline` of an eval's stored summary (Run.summary_json); None for a summary without pass@k."""
    if not isinstance(summary.get("pass_at"), dict):
        return None
    infra = int(summary.get("n_infra_failed") or 0)
    return headline(summary["pass_at"], int(summary.get("n_rollouts") or 0) - infra, infra)


def _wall(r: Rollout) -> float:
    if r.started_at is None or r.ended_at is None:
        return 0.0
    start, end = r.started_at, r.ended_at
    if (start.tzinfo is None) != (end.tzinfo is None):  # SQLite hands datetimes back naive
        start, end = start.replace(tzinfo=None), end.replace(tzinfo=None)
    return max(0.0, (end - start).total_seconds())


def task_metrics(task_id: str, rollouts: Sequence[Rollout], k_values: Iterable[int], *, threshold: float = 1.0,
                 usage: dict[str, tuple[int, int]] | None = None) -> TaskMetrics:
    """Metrics of one task's rollouts. `usage` maps rollout id -> (calls, tokens)."""
    samples = [r for r in rollouts if r.status in DATA_STATES]
    rewards = [r.reward or 0.0 for r in samples]
    n, c = len(samples), sum(1 for x in rewards if x >= threshold)
    usage = usage or {}
    m = TaskMetrics(task_id=task_id, n=n, n_pass=c, n_infra_failed=sum(1 for r in rollouts if is_infra_failure(r)),
                    mean_reward=fmean(rewards) if rewards else None)
    for k in k_values:
        m.pass_at[k] = pass_at_k(n, c, k) if 1 <= k <= n else None
        m.pass_hat[k] = pass_hat_k(n, c, k) if 1 <= k <= n else None
    for r in rollouts:
        calls, tokens = usage.get(r.id, (r.n_calls, 0))
        m.calls += calls
        m.tokens += tokens
        m.wall_s += _wall(r)
    return m


def _mean(values: Iterable[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return fmean(got) if got else None


def run_metrics(tasks: list[TaskMetrics], k_values: Sequence[int]) -> RunMetrics:
    return RunMetrics(
        tasks=tasks, k_values=list(k_values),
        n_rollouts=sum(t.n + t.n_infra_failed for t in tasks), n_infra_failed=sum(t.n_infra_failed for t in tasks),
        mean_reward=_mean(t.mean_reward for t in tasks),
        pass_at={k: _mean(t.pass_at[k] for t in tasks) for k in k_values},
        pass_hat={k: _mean(t.pass_hat[k] for t in tasks) for k in k_values},
        calls=sum(t.calls for t in tasks), tokens=sum(t.tokens for t in tasks), wall_s=sum(t.wall_s for t in tasks),
    )


def summarize_run(store: Store, run_id: str, k_values: Sequence[int], *, step: int | None = None,
                  harness: str | None = None) -> RunMetrics:
    """Metrics of a run's rollouts (one step of it, those of one harness, if given), thresholds from
    the run's task copies."""
    rollouts = [r for r in store.list_rollouts(run_id, step=step) if harness is None or r.harness == harness]
    thresholds = {t.task_id: float((t.spec_json or {}).get("pass_threshold", 1.0))
                  for t in store.list_tasks(run_id)}
    usage: dict[str, tuple[int, int]] = {}
    for call in store.list_calls(run_id=run_id):
        calls, tokens = usage.get(call.rollout_id, (0, 0))
        usage[call.rollout_id] = (calls + 1, tokens + call.prompt_tokens + call.completion_tokens)
    by_task: dict[str, list[Rollout]] = {}
    for r in rollouts:
        by_task.setdefault(r.task_id, []).append(r)
    tasks = [task_metrics(tid, rs, k_values, threshold=thresholds.get(tid, 1.0), usage=usage)
             for tid, rs in by_task.items()]
    return run_metrics(tasks, k_values)
