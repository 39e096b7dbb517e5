"""An eval's harness x figure table and the difference of two evals, with 95% bootstrap intervals
(rollouts/analysis/eval_figures.py; issue 45): the interval math on hand-computed cases, the figures of
runs in a real store, and `forge eval --harness a,b` then `--compare RUN` through the CLI."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers.paths import REPO
from openforge.rollouts.analysis import eval_figures
from openforge.rollouts.analysis.eval_figures import (compare_runs, figure_names, harness_figures, interval,
                                                      paired_difference, task_values)
from openforge.rollouts.runner.metrics import run_metrics, task_metrics
from openforge.store import Rollout, Store

HELLO = REPO / "docs" / "examples" / "hello-agent" / "hello-agent.toml"


def test_docstring_examples() -> None:
    assert doctest.testmod(eval_figures).failed == 0


@pytest.mark.parametrize(("ks", "want"), [
    ([1], ["pass@1"]),
    ([1, 3], ["pass@1", "pass@3", "pass^3"]),
    ([2, 4], ["pass@2", "pass@4", "pass^2", "pass^4"]),
])
def test_figure_names(ks: list[int], want: list[str]) -> None:
    assert figure_names(ks) == want


def test_interval_over_tasks() -> None:
    same = interval({"a": 0.25, "b": 0.25})
    assert (same.mean, same.lo, same.hi, same.n) == (0.25, 0.25, 0.25, 2)  # no spread: no width
    # Two tasks, 0 and 1: a resample is (0,0), (0,1), (1,0) or (1,1), each 1/4: means 0, 0.5, 1 with
    # probabilities 1/4, 1/2, 1/4, so the 2.5th and 97.5th percentiles are 0 and 1.
    two = interval({"a": 0.0, "b": 1.0})
    assert (two.mean, two.lo, two.hi, two.n) == (0.5, 0.0, 1.0, 2)
    assert interval({}).mean is None


def test_paired_difference_pairs_by_task_and_leaves_out_the_unpaired() -> None:
    # Every task gained 0.1: paired, the interval has no width, however far apart the tasks are.
    base, other = {"easy": 0.9, "hard": 0.0, "only-base": 0.5}, {"easy": 1.0, "hard": 0.1, "only-other": 1.0}
    diff = paired_difference(base, other)
    assert diff.mean == pytest.approx(0.1) and diff.lo == pytest.approx(0.1) and diff.hi == pytest.approx(0.1)
    assert diff.n == 2
    # One task gained 1, two did not: resampled means are k/3 for k gains among 3 draws; P(0 gains) =
    # (2/3)^3 = 0.30 and P(3 gains) = (1/3)^3 = 0.04, so the interval is [0, 1].
    gain = paired_difference({"a": 0.0, "b": 0.0, "c": 1.0}, {"a": 1.0, "b": 0.0, "c": 1.0})
    assert (round(gain.mean, 4), gain.lo, gain.hi, gain.n) == (0.3333, 0.0, 1.0, 3)
    assert paired_difference({"a": 1.0}, {"b": 1.0}).mean is None


def _rollouts(task: str, rewards: list[float], harness: str = "mini") -> list[Rollout]:
    return [Rollout(run_id="r", task_id=task, status="scored", reward=r, harness=harness) for r in rewards]


def test_task_values_are_each_tasks_unbiased_estimate() -> None:
    # n=4, c=2: pass@2 = 1 - C(2,2)/C(4,2) = 5/6, pass^2 = C(2,2)/C(4,2) = 1/6; one sample has no pass@2
    metrics = run_metrics([task_metrics("a", _rollouts("a", [1, 0, 0, 1]), [1, 2]),
                           task_metrics("b", _rollouts("b", [1]), [1, 2])], [1, 2])
    assert task_values(metrics, "pass@1") == {"a": 0.5, "b": 1.0}
    assert task_values(metrics, "pass@2") == pytest.approx({"a": 5 / 6})
    assert task_values(metrics, "pass^2") == pytest.approx({"a": 1 / 6})


def _eval(store: Store, samples: dict[tuple[str, str], list[float]]) -> str:
    """An eval run in `store` whose (task, harness) rollouts got these rewards; plus an infra failure."""
    run = store.create_run(kind="eval")
    for (task, harness), rewards in samples.items():
        for i, reward in enumerate(rewards):
            ro = store.create_rollout(run_id=run.id, task_id=task, harness=harness, sample_index=i)
            store.update_rollout(ro.id, status="scored", reward=reward)
    ro = store.create_rollout(run_id=run.id, task_id="t1", harness="mini", sample_index=9)
    store.update_rollout(ro.id, status="failed", failure_kind="infra", error="infra: the sandbox died")
    return run.id


def test_harness_figures_and_compare_runs_from_the_store(store: Store) -> None:
    base = _eval(store, {("t1", "mini"): [0, 0], ("t2", "mini"): [1, 0], ("t1", "codex"): [1, 1]})
    new = _eval(store, {("t1", "mini"): [1, 0], ("t2", "mini"): [1, 1], ("t3", "mini"): [1, 1]})
    [codex, mini] = harness_figures(store, base, [1, 2])
    assert (codex.harness, codex.n_samples, codex.n_infra_failed) == ("codex", 2, 0)
    assert (mini.harness, mini.n_samples, mini.n_infra_failed) == ("mini", 4, 1)  # the infra failure: left out
    assert mini.figures["pass@1"].mean == 0.25 and mini.figures["pass@2"].mean == 0.5  # t1 0 / 0, t2 0.5 / 1
    assert mini.figures["pass^2"].mean == 0.0 and codex.figures["pass^2"].mean == 1.0
    # mini in both (codex only in base): t1 0 -> 0.5, t2 0.5 -> 1 (pass@1); t3 only in the new run
    [change] = compare_runs(store, new, base, [1, 2])
    assert (change.harness, change.n_paired, change.n_unpaired) == ("mini", 2, 1)
    assert (change.figures["pass@1"].mean, change.figures["pass@1"].lo, change.figures["pass@1"].hi) == (0.5, 0.5, 0.5)
    assert change.figures["pass^2"].mean == 0.5  # t1 0 -> 0, t2 0 -> 1


@pytest.mark.slow
def test_forge_eval_by_harness_then_compared_with_it(tiny_model: Path, store: Store) -> None:
    """Two harnesses, then a second eval (another 'adapter': an engine that answers both tasks) against it."""
    from openforge.engine.scripted import ScriptedEngine
    from openforge.engine.serve import serve_in_thread
    from openforge.forge_cli.main import app

    args = ["eval", "--tasks", "builtin", "--task", "easy-say-hello", "--task", "easy-say-done", "-k", "2",
            "--pass-k", "1", "--pass-k", "2", "--concurrency", "4", "--model", str(tiny_model)]
    first = ScriptedEngine(tiny_model, lambda ids: "hello world")  # right for one task, wrong for the other
    with serve_in_thread(first.app) as eng:
        out = CliRunner().invoke(app, [*args, "--engine-url", eng.url, "--harness", f"mini,{HELLO}", "--name", "base"])
    assert out.exit_code == 0, out.output
    [base] = store.list_runs()
    rows = {r["harness"]: r for r in base.summary_json["harness_figures"]}
    assert set(rows) == {"mini", "hello-agent"} and rows["mini"]["n_samples"] == 4
    assert rows["mini"]["figures"]["pass@1"] == {"mean": 0.5, "lo": 0.0, "hi": 1.0, "n": 2}
    assert "by harness" in out.output and "pass^2" in out.output and "[0.00, 1.00]" in out.output

    second = ScriptedEngine(tiny_model, lambda ids: "done" if "word: done" in second.tokenizer.decode(ids)
                            else "hello world")
    with serve_in_thread(second.app) as eng:
        out = CliRunner().invoke(app, [*args, "--engine-url", eng.url, "--harness", "mini", "--compare", base.id[:-2]])
    assert out.exit_code == 0, out.output
    new = next(r for r in store.list_runs() if r.id != base.id)
    [change] = new.summary_json["compare"]["by_harness"]  # mini only: hello-agent is not in this run
    assert new.summary_json["compare"]["run"] == base.id and (change["harness"], change["n_paired"]) == ("mini", 2)
    # easy-say-hello 1 -> 1, easy-say-done 0 -> 1: +0.5, the interval [0, 1] over the two tasks
    assert change["figures"]["pass@1"] == {"mean": 0.5, "lo": 0.0, "hi": 1.0, "n": 2}
    assert f"less eval {base.id}" in out.output and "[+0.00, +1.00]" in out.output

    bad = CliRunner().invoke(app, [*args, "--engine-url", "http://127.0.0.1:9", "--compare", "run-nope"])
    assert bad.exit_code != 0 and "run-nope" in bad.output and bad.output.count("\n") <= 2, bad.output
