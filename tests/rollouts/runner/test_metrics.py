"""pass@k / pass^k against their formulas and against brute force over every k-subset of samples."""

from __future__ import annotations

from datetime import timedelta
from itertools import combinations

import pytest
from hypothesis import given, strategies as st

from openforge.store import Call, Store, utcnow
from openforge.rollouts.runner.metrics import pass_at_k, pass_hat_k, summarize_run


@pytest.mark.parametrize(("n", "c", "k", "at", "hat"), [
    (5, 2, 2, 1 - 3 / 10, 1 / 10),  # C(3,2)/C(5,2) = 3/10; C(2,2)/C(5,2) = 1/10
    (5, 3, 2, 1 - 1 / 10, 3 / 10),
    (4, 0, 1, 0.0, 0.0),
    (4, 4, 3, 1.0, 1.0),
    (10, 1, 1, 0.1, 0.1),
    (10, 3, 5, 1 - 21 / 252, 0.0),  # C(7,5)=21, C(10,5)=252; C(3,5)=0
    (3, 1, 3, 1.0, 0.0),
])
def test_known_counts(n: int, c: int, k: int, at: float, hat: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(at)
    assert pass_hat_k(n, c, k) == pytest.approx(hat)


@given(st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_estimators_equal_the_mean_over_all_k_subsets(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    samples = [True] * c + [False] * (n - c)
    subsets = list(combinations(samples, k))
    assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    assert pass_hat_k(n, c, k) == pytest.approx(sum(all(s) for s in subsets) / len(subsets))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match="c <= n"):
        pass_hat_k(3, 4, 1)


def test_summarize_run_per_task_and_overall(store: Store) -> None:
    run = store.create_run(kind="eval")
    store.add_tasks(run.id, [{"id": "a", "instruction": "x", "pass_threshold": 0.5},
                             {"id": "b", "instruction": "y"}])
    t0 = utcnow()
    rewards = {"a": [1.0, 0.6, 0.2, None], "b": [1.0, 0.0, 0.0]}
    for task, rs in rewards.items():
        for i, reward in enumerate(rs):
            r = store.create_rollout(run_id=run.id, task_id=task, sample_index=i)
            status = "failed" if reward is None else ("timed_out" if (task, i) == ("b", 2) else "scored")
            store.update_rollout(r.id, status=status, reward=reward, started_at=t0, ended_at=t0 + timedelta(seconds=2))
            if task == "a" and i == 0:
                for seq in range(2):
                    store.add_call(Call(run_id=run.id, rollout_id=r.id, seq=seq, status="ok",
                                        prompt_tokens=10, completion_tokens=5))
    m = summarize_run(store, run.id, [1, 2, 4])
    a, b = sorted(m.tasks, key=lambda t: t.task_id)
    # a: 3 samples (one infra failure left out), 2 pass at threshold 0.5
    assert (a.n, a.n_pass, a.n_infra_failed) == (3, 2, 1)
    assert a.mean_reward == pytest.approx(0.6)
    assert a.pass_at[1] == pytest.approx(2 / 3) and a.pass_hat[2] == pytest.approx(1 / 3)
    assert a.pass_at[4] is None  # k > n
    assert (a.calls, a.tokens, a.wall_s) == (2, 30, pytest.approx(8.0))
    # b: the timeout is a sample (reward 0)
    assert (b.n, b.n_pass) == (3, 1) and b.pass_at[2] == pytest.approx(1 - 1 / 3)
    assert m.mean_reward == pytest.approx((0.6 + 1 / 3) / 2)
    assert m.pass_at[1] == pytest.approx((2 / 3 + 1 / 3) / 2)
    assert m.pass_at[4] is None and (m.n_rollouts, m.n_infra_failed) == (7, 1)
    assert m.to_json()["pass_at"]["1"] == pytest.approx(0.5)
