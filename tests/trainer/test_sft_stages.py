"""Base -> SFT on the demo tasks, end to end and short (bench/sft_stages.py measures the whole curve):
a scripted teacher that reads each question's line of digits drives the real mini harness under `forge
collect`, `forge sft` trains the warmed-up tiny student on what passed, and the first step of `forge
train --init-from` (sampled before any update) shows the SFT policy's pass rate above what a policy blind
to the question can score (1/k for k tasks whose answers differ; the base starts at or under it by
construction, tests/trainer/test_tasks_demo.py). The measured three-stage curve is in docs/dashboard.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.sft_stages import collect_and_sft, rl


@pytest.mark.slow
@pytest.mark.timeout(1500)  # ~3 minutes on 2 idle cores; the guard is for loaded ones
def test_sft_on_a_teachers_kept_rollouts_lifts_the_demo_above_the_blind_ceiling(tmp_path: Path) -> None:
    home = tmp_path / "home"
    data = collect_and_sft(home, samples=4, epochs=10)
    assert data["collected"] == data["kept"] == 8, data  # 2 tasks x 4, every one graded right
    assert data["sft_loss_last"] < data["sft_loss_first"] - 0.3, data

    first = rl(home, 1, init_from=data["sft_run"], sets=["runner.samples_per_task=4"])
    blind = 1 / len(first["per_task"])
    print(f"\nSFT: {data}\nits pass rate before any RL update: {first}; blind {blind:.2f}")
    assert set(first["per_task"]) == {"demo-digit-3", "demo-digit-8"}
    assert first["per_step"][0] > blind + 0.2, first
    assert all(rates[0] > 0 for rates in first["per_task"].values()), first  # right on each question
