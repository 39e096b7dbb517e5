"""A resume trains the groups that had finished before the stop instead of sampling them again (trainer/resume.py)."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import text

from openforge.store import Rollout, Store
from openforge.trainer import loop
from openforge.trainer.checkpoint import adapter_name
from openforge.trainer.loop import TaskStream, train
from openforge.trainer.resume import kept_groups
from tests.helpers.trainer import TASKS, ReplaySampler, _cfg


class StopAfterSampling(ReplaySampler):
    """Samples step `stop_after` in full (its rollouts scored, in the store), then stops the run: a Ctrl-C
    that lands after a step's rollouts finished and before the step trained."""

    def __init__(self, store: Store, stop_after: int, in_flight: int | None = None) -> None:
        super().__init__(store)
        self.stop_after, self.in_flight = stop_after, in_flight

    def sample(self, run_id: str, tasks: list, *, step: int, adapter: str | None) -> list[Rollout]:
        out = super().sample(run_id, tasks, step=step, adapter=adapter)
        if step == self.stop_after:
            if self.in_flight is not None:  # that rollout was still running at the stop
                self.store.update_rollout(out[self.in_flight].id, status="running")
            raise KeyboardInterrupt
        return out


@pytest.fixture
def trained(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The rollout ids of every batch the loop builds, in order (the loop's own build_batch, watched)."""
    batches: list[list[str]] = []
    real = loop.build_batch

    def watched(rollouts, *args, **kw):
        batches.append([r.id for r in rollouts])
        return real(rollouts, *args, **kw)

    monkeypatch.setattr(loop, "build_batch", watched)
    return batches


def _stopped_after_sampling(store: Store, tiny_model: Path, forge_home: Path, step: int,
                            in_flight: int | None = None, **cfg) -> tuple[str, list[str]]:
    """A run stopped once step `step`'s rollouts finished (but the `in_flight`-th), before it trained: its
    id and those rollouts' ids."""
    run = store.create_run()
    with pytest.raises(KeyboardInterrupt):
        train(store, run.id, _cfg(steps=4, **cfg), model_path=tiny_model, tasks=TASKS,
              sampler=StopAfterSampling(store, stop_after=step, in_flight=in_flight), home=forge_home)
    assert [s.step for s in store.list_train_steps(run.id)] == list(range(step))
    finished = store.list_rollouts(run.id, step=step)
    assert len([r for r in finished if r.status == "scored"]) == len(finished) - (in_flight is not None)
    return run.id, [r.id for r in finished]


def test_a_resume_trains_the_finished_rollouts_of_the_untrained_step(store: Store, tiny_model: Path,
                                                                     forge_home: Path, trained: list) -> None:
    run_id, finished = _stopped_after_sampling(store, tiny_model, forge_home, 2)
    trained.clear()
    resumed = ReplaySampler(store)
    train(store, run_id, _cfg(steps=4), model_path=tiny_model, tasks=TASKS, sampler=resumed, home=forge_home,
          resume=True)
    assert [c[0] for c in resumed.calls] == [3]  # step 2 was not sampled again
    assert trained[0] == finished  # step 2 trained on those very rollouts, in their order
    assert [r.id for r in store.list_rollouts(run_id, step=2)] == finished  # and no new ones
    rows = store.list_train_steps(run_id)
    assert [r.step for r in rows] == [0, 1, 2, 3] and rows[2].n_rollouts == len(finished)
    assert rows[2].metrics_json["resume_kept_groups"] == 2 and rows[2].metrics_json["resume_stale_groups"] == 0
    assert not set(trained[0]) & set(trained[1])  # nothing trained twice


def test_a_full_fine_tune_resume_trains_the_finished_rollouts_by_the_weights_version_they_recorded(
        store: Store, tiny_model: Path, forge_home: Path, trained: list) -> None:
    """Full fine-tuning replaces the weights in place, so its rollouts ask for no adapter: the version of
    the weights each was sampled under is the one its row recorded when it was created."""
    full = dict(full_finetune=True, lr=1e-4)
    run_id, finished = _stopped_after_sampling(store, tiny_model, forge_home, 2, **full)
    trained.clear()
    resumed = ReplaySampler(store)
    train(store, run_id, _cfg(steps=4, **full), model_path=tiny_model, tasks=TASKS, sampler=resumed,
          home=forge_home, resume=True)
    assert [c[0] for c in resumed.calls] == [3]  # step 2 was not sampled again
    assert trained[0] == finished and [r.id for r in store.list_rollouts(run_id, step=2)] == finished
    step2 = store.list_train_steps(run_id)[2]
    assert step2.metrics_json["resume_kept_groups"] == 2 and step2.n_rollouts == len(finished)


def test_a_group_with_a_rollout_in_flight_at_the_stop_is_sampled_again(store: Store, tiny_model: Path,
                                                                       forge_home: Path, trained: list) -> None:
    run_id, rows = _stopped_after_sampling(store, tiny_model, forge_home, 2, in_flight=4)  # the 2nd group's 2nd
    first, second = rows[:3], rows[3:]
    assert store.get_rollout(second[1]).status == "interrupted"  # marked by the stop
    trained.clear()
    resumed = ReplaySampler(store)
    train(store, run_id, _cfg(steps=4), model_path=tiny_model, tasks=TASKS, sampler=resumed, home=forge_home,
          resume=True)
    task = store.get_rollout(second[0]).task_id
    assert [(c[0], c[1]) for c in resumed.calls][0] == (2, [task])  # only the interrupted group, again
    assert trained[0][:3] == first and not set(trained[0]) & set(second) and len(trained[0]) == 6
    step2 = store.list_train_steps(run_id)[2]
    assert step2.metrics_json["resume_kept_groups"] == 1 and step2.n_rollouts == 6


def test_a_stale_finished_group_is_dropped_counted_and_sampled_again(store: Store, tiny_model: Path, forge_home: Path,
                                                                     trained: list,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    run_id, finished = _stopped_after_sampling(store, tiny_model, forge_home, 2)
    # As if step 0's adapter (version 1) had sampled them: one version behind step 2, over max_staleness 0.
    with store.session() as s:
        s.connection().execute(text("UPDATE rollout SET adapter=:a, policy_version=1 WHERE run_id=:r AND step=2"),
                               {"a": f"{run_id}-step-0", "r": run_id})
        s.commit()
    trained.clear()
    resumed = ReplaySampler(store)
    with caplog.at_level(logging.INFO, logger="forge.trainer"):
        train(store, run_id, _cfg(steps=4), model_path=tiny_model, tasks=TASKS, sampler=resumed, home=forge_home,
              resume=True)
    assert [(c[0], c[2]) for c in resumed.calls] == [(2, f"{run_id}-step-1"), (3, f"{run_id}-step-2")]
    assert not set(trained[0]) & set(finished) and len(trained[0]) == len(finished)
    step2 = store.list_train_steps(run_id)[2]
    assert step2.metrics_json["resume_stale_groups"] == 2 and step2.metrics_json["resume_kept_groups"] == 0
    assert "2 stale group(s) dropped" in caplog.text


def test_a_partial_rollout_is_judged_by_the_version_it_started_under(store: Store) -> None:
    """Rollouts moved onto newer adapters (`rollout_versions` > 1) keep the version they were created under:
    a resume at step 3 with K = 1 judges each group by that (its oldest tokens), not by the adapter it ended on."""
    run = store.create_run()
    stream = TaskStream([{"id": "a"}, {"id": "b"}], seed=0)
    for version, task in zip((1, 2), stream.take(0, 2)):  # the group at position 0 under version 1, then 2
        store.update_run(run.id, current_adapter=adapter_name(run.id, version - 1), policy_version=version)
        for k in range(2):
            store.create_rollout(run_id=run.id, task_id=task["id"], sample_index=k,
                                 adapter=adapter_name(run.id, version - 1), status="running")
    newest = adapter_name(run.id, 2)
    store.update_run(run.id, current_adapter=newest, policy_version=3)
    assert store.move_live_rollouts(run.id, newest, max_adapters=3, past_cap=False) == (4, 0)
    for r in store.list_rollouts(run.id):
        store.update_rollout(r.id, status="scored", reward=1.0)
    kept = kept_groups(store, run.id, stream, [0, 1], groups_per_step=2, start=3, max_staleness=1, by_adapter=False)
    assert {p: g.version for p, g in kept.groups.items()} == {1: 2} and kept.stale == 1  # 3 - 1 > 1: stale
    assert {r.adapter for g in kept.groups.values() for r in g.rollouts} == {newest}


@pytest.mark.parametrize("update", [{}, {"rollout_versions": 2}, {"full_finetune": True, "lr": 1e-4}],
                         ids=["lora", "partial-rollouts", "full-finetune"])
def test_an_async_resume_trains_every_group_once_and_keeps_the_finished_ones(store: Store, tiny_model: Path,
                                                                             forge_home: Path, trained: list,
                                                                             update: dict) -> None:
    """max_staleness = 1: groups of step 2 finish while step 1 trains, then a group of step 3 stops the run.
    The resume trains step 2's finished groups without sampling them again, and the run's batches hold every
    stream position once (the checkpoint's admitted-but-untrained groups were lost before). The same with
    partial rollouts (each row's version its oldest) and full fine-tuning (rows name no adapter)."""
    tasks, steps = TASKS[:4], 5  # 2 groups a step never straddle a pass over the tasks: no task twice in a step
    run = store.create_run()
    with pytest.raises(KeyboardInterrupt):
        train(store, run.id, _cfg(steps=steps, max_staleness=1, **update), model_path=tiny_model, tasks=tasks,
              sampler=ReplaySampler(store, stop_at=3), home=forge_home)
    for t in threading.enumerate():  # groups left sampling write on (a new process would start after them)
        if t.name.startswith("forge-group-"):
            t.join(timeout=30)
    before = {i for batch in trained for i in batch}
    finished = {r.id: r for r in store.list_rollouts(run.id) if r.status == "scored" and r.id not in before}
    assert finished  # step 2's groups, finished and not trained
    resumed = ReplaySampler(store)
    train(store, run.id, _cfg(steps=steps, max_staleness=1, **update), model_path=tiny_model, tasks=tasks,
          sampler=resumed, home=forge_home, resume=True)
    ids = [i for batch in trained for i in batch]
    assert len(ids) == len(set(ids))  # nothing trained twice
    assert set(finished) <= set(ids)  # the finished groups trained as they were
    assert not {(c[0], t) for c in resumed.calls for t in c[1]} & {(r.step, r.task_id) for r in finished.values()}
    rows = {r.id: r for r in store.list_rollouts(run.id)}
    groups = Counter((rows[i].step, rows[i].task_id) for i in ids if rows[i].sample_index == 0)
    assert len(groups) == steps * 2 and set(groups.values()) == {1}  # every position of the stream, once
    assert [s.step for s in store.list_train_steps(run.id)] == list(range(steps))
