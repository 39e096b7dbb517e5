"""An eval's figures with 95% bootstrap intervals: a harness x figure table for one model, and the
difference between two evals (two adapters, base and trained), paired by task.

    rows = harness_figures(store, run_id, [1, 3])      one HarnessFigures per harness of the run
    rows[0].figures["pass@3"]                          Estimate(mean, lo, hi, n = tasks with a value)
    changes = compare_runs(store, run_id, base_run_id, [1, 3])   this run minus the earlier one

A run's figure is the mean over its tasks of each task's unbiased estimate (pass@k, pass^k of its n
samples: rollouts/runner/metrics.py); its interval is the percentile bootstrap over tasks: the task set
is the sample, so a figure of 10 tasks gets a wide interval however many samples each has. A
difference is the mean over the tasks both runs have of this run's value less the other's, resampled by
task: paired, so how hard a task is cancels out. A task only one run has is left out and counted.
Both go through `bootstrap_mean` of rollouts/analysis/analyze.py (`forge analyze`'s), seeded: the same
figures give the same interval.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from openforge.rollouts.analysis.analyze import Estimate, bootstrap_mean
from openforge.rollouts.runner.metrics import RunMetrics, summarize_run
from openforge.store import Store


def figure_names(k_values: Sequence[int]) -> list[str]:
    """The figures of an eval's harness table: pass@k for every k, pass^k for every k > 1 (pass^1 is pass@1).

    >>> figure_names([1, 3])
    ['pass@1', 'pass@3', 'pass^3']
    """
    return [f"pass@{k}" for k in k_values] + [f"pass^{k}" for k in k_values if k > 1]


def task_values(metrics: RunMetrics, figure: str) -> dict[str, float]:
    """Each task's value of `figure` ("pass@3", "pass^3"); a task with fewer samples than k has none."""
    kind, k = figure[:5], int(figure[5:])
    return {t.task_id: v for t in metrics.tasks
            if (v := (t.pass_at if kind == "pass@" else t.pass_hat).get(k)) is not None}


def interval(values: Mapping[str, float]) -> Estimate:
    """The mean of per-task values and its 95% bootstrap interval over tasks (n = tasks).

    >>> interval({"a": 0.5, "b": 0.5, "c": 0.5})
    Estimate(mean=0.5, lo=0.5, hi=0.5, n=3)
    """
    return bootstrap_mean(list(values.values()))


def paired_difference(base: Mapping[str, float], other: Mapping[str, float]) -> Estimate:
    """mean(other[t] - base[t]) over the tasks t both have, with its 95% bootstrap interval over those
    tasks (n = tasks paired). Two tasks, one gained 1 and one unchanged: the resampled means are 0, 0.5
    or 1 (each pair of draws), so the interval is [0, 1].

    >>> paired_difference({"a": 0.0, "b": 1.0}, {"a": 1.0, "b": 1.0, "c": 0.0})
    Estimate(mean=0.5, lo=0.0, hi=1.0, n=2)
    """
    return bootstrap_mean([other[t] - base[t] for t in sorted(base.keys() & other.keys())])


@dataclass
class HarnessFigures:
    harness: str
    n_samples: int  # the policy's rollouts (scored or timed out)
    n_infra_failed: int  # left out of every figure, counted here
    figures: dict[str, Estimate]


@dataclass
class HarnessChange:
    harness: str
    n_paired: int  # tasks both runs have (in this harness)
    n_unpaired: int  # tasks only one of them has: left out
    figures: dict[str, Estimate]  # mean = this run - the other


def _by_harness(store: Store, run_id: str, k_values: Sequence[int]) -> dict[str, RunMetrics]:
    names = sorted({r.harness for r in store.list_rollouts(run_id)})
    return {h: summarize_run(store, run_id, k_values, harness=h) for h in names}


def harness_figures(store: Store, run_id: str, k_values: Sequence[int]) -> list[HarnessFigures]:
    """One row per harness of the run: each figure (`figure_names`) with its interval over tasks."""
    rows = []
    for harness, metrics in _by_harness(store, run_id, k_values).items():
        rows.append(HarnessFigures(harness, metrics.n_rollouts - metrics.n_infra_failed, metrics.n_infra_failed,
                                   {f: interval(task_values(metrics, f)) for f in figure_names(k_values)}))
    return rows


def compare_runs(store: Store, run_id: str, base_run_id: str, k_values: Sequence[int]) -> list[HarnessChange]:
    """Per harness both runs have: each figure of `run_id` less `base_run_id`'s, paired by task."""
    ours, theirs = _by_harness(store, run_id, k_values), _by_harness(store, base_run_id, k_values)
    changes = []
    for harness in sorted(ours.keys() & theirs.keys()):
        mine, base = {t.task_id for t in ours[harness].tasks}, {t.task_id for t in theirs[harness].tasks}
        changes.append(HarnessChange(harness, len(mine & base), len(mine ^ base), {
            f: paired_difference(task_values(theirs[harness], f), task_values(ours[harness], f))
            for f in figure_names(k_values)}))
    return changes


def to_json(rows: Sequence[HarnessFigures | HarnessChange]) -> list[dict[str, Any]]:
    """JSON-ready rows, for an eval's summary_json."""
    return [asdict(r) for r in rows]
