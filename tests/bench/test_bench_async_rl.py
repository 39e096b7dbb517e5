"""bench/async_rl.py's figures: the trainer's idle fraction and the training-bound section's medians."""

from bench import async_rl


def _step(wait: float, train: float, sync: float) -> dict:
    return {"t_rollout_s": wait, "t_train_s": train, "t_sync_s": sync}


def test_idle_fraction_is_the_loops_wait_over_its_time():
    steps = [_step(2.0, 0.5, 0.5), _step(0.0, 0.9, 0.1), _step(1.0, 0.8, 0.2)]
    assert async_rl.idle_fraction(steps) == 0.5  # 3 s waited of 6 s
    assert async_rl.idle_fraction(steps[1:]) == 0.3333  # without step 0's pipeline fill: 1 s of 3 s
    assert async_rl.idle_fraction([]) == 0.0


def test_training_bound_figures_are_medians_and_ratios_are_taken_within_each_repeat():
    sync = [{"tokens_per_min": 100, "idle_fraction_after_first": 0.3},
            {"tokens_per_min": 50, "idle_fraction_after_first": 0.2},
            {"tokens_per_min": 80, "idle_fraction_after_first": 0.25}]
    k2 = [{"tokens_per_min": 130, "idle_fraction_after_first": 0.001},  # 1.3x its repeat's sync
          {"tokens_per_min": 60, "idle_fraction_after_first": 0.0},  # 1.2x
          {"tokens_per_min": 200, "idle_fraction_after_first": 0.002}]  # 2.5x (a quiet minute)
    figures = async_rl._median_figures(k2, sync)
    assert figures["tokens_per_min"] == 130 and figures["idle_fraction_after_first"] == 0.001
    assert figures["idle_fraction_after_first_runs"] == [0.001, 0.0, 0.002]
    assert figures["tokens_per_min_vs_sync"] == 1.3  # median of 1.3, 1.2, 2.5; medians' ratio would be 1.62


def test_both_sections_draw_the_same_durations_at_their_own_median():
    sampling = async_rl.duration("task-3", 2, 1)
    training = async_rl.duration("task-3", 2, 1, async_rl.TRAINING_BOUND)
    assert abs(training / sampling - async_rl.TRAINING_BOUND.median_s / async_rl.MEDIAN_S) < 1e-12
