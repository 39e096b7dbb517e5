"""Versions per token: partial rollouts whose calls span adapter versions (`trainer.rollout_versions`).

The rollout's calls go through the real proxy (openai SDK over loopback, the scripted engine behind it):
the proxy serves each call with the rollout's adapter at that moment and records it on the call row;
`Store.move_live_rollouts` is what the async buffer calls when it publishes a new adapter."""

from __future__ import annotations

import threading
import time
from typing import Any

import openai
import pytest

from openforge.config import TrainerConfig
from openforge.errors import TrainerError
from openforge.rollouts.runner.trajectory import assemble_rollout
from openforge.store import Call, Rollout, Store, Trajectory
from openforge.trainer.buffer import GroupBuffer, PartialRollouts
from openforge.trainer.checkpoint import adapter_name
from openforge.trainer.data import build_batch, call_sampling, micro_batches, version_metrics
from openforge.trainer.loop import TaskStream, train
from tests.helpers.proxy_rig import make_rig  # noqa: F401 - fixture
from tests.helpers.trainer import TASKS, _cfg

pytestmark = pytest.mark.timeout(120)


def _chat(rig: Any, msgs: list[dict[str, Any]]) -> Any:
    c = openai.OpenAI(base_url=rig.url + "/v1", api_key=rig.key, max_retries=0, timeout=30)
    return c.chat.completions.create(model="policy", messages=msgs).choices[0].message


def _two_version_rollout(rig: Any) -> tuple[str, str, str]:
    """One conversation: turn 1 under the base model (version 0), then the adapter after step 0
    (version 1) is published and the running rollout moves onto it for turn 2."""
    run_id = rig.rollout.run_id
    v1, v2 = adapter_name(run_id, 0), adapter_name(run_id, 1)
    rig.engine.adapters.update({v1: "/adapters/v1", v2: "/adapters/v2"})
    msgs = [{"role": "user", "content": "count to three"}]
    first = _chat(rig, msgs)
    moved = rig.store.move_live_rollouts(run_id, v1, max_adapters=2, past_cap=False)
    assert moved == (1, 0)
    _chat(rig, msgs + [first.model_dump(exclude_none=True), {"role": "user", "content": "go on"}])
    return run_id, v1, v2


def test_a_rollout_served_by_two_versions_trains_each_token_with_its_own_behaviour_logprob(make_rig) -> None:
    rig = make_rig(["one two", "three four five"])
    run_id, v1, _ = _two_version_rollout(rig)
    calls = rig.calls()
    assert [c.adapter for c in calls] == [None, v1]  # each call records the adapter that served it
    assert "lora_path" not in rig.engine.requests[0] and rig.engine.requests[1]["lora_path"] == v1

    assemble_rollout(rig.store, rig.rollout.id)
    rollout = rig.store.update_rollout(rig.rollout.id, status="scored", reward=1.0)
    trajs = rig.store.list_trajectories(rollout_ids=[rollout.id])
    assert len(trajs) == 1  # one token sequence across both versions
    batch = build_batch([rollout], trajs, sampling=call_sampling(rig.store, [rollout.id]))
    (s,) = batch.samples
    n0, n1 = len(calls[0].completion_ids), len(calls[1].completion_ids)
    assert [v for v in s.versions if v >= 0] == [0] * n0 + [1] * n1
    assert all(v == -1 for v, m in zip(s.versions, s.loss_mask) if not m)
    # the behaviour logprob of every sampled token is the one its own call recorded
    assert [lp for lp, m in zip(s.logprobs, s.loss_mask) if m] == calls[0].logprobs + calls[1].logprobs
    (mb,) = micro_batches(batch.samples, token_budget=4096, pad_id=0, loss_agg="token-mean")
    n = len(s.token_ids)
    assert mb["old_logp"][0, : n - 1].tolist() == pytest.approx(s.logprobs[1:])  # mu per token, into the TIS weight
    assert batch.spanning_rollouts == 1
    # trained at step 2 (the policy of version 2): the base model's tokens are 2 behind, version 1's 1
    assert version_metrics(batch, 2) == {"token_staleness": {1: n1, 2: n0}, "spanning_rollouts": 1,
                                         "version_dropped_groups": 0}
    # a cap of one version per rollout drops its group, counted
    capped = build_batch([rollout], trajs, sampling=call_sampling(rig.store, [rollout.id]), max_versions=1)
    assert capped.samples == [] and capped.version_dropped_groups == 1 and capped.n_groups == 0


def test_the_cap_on_versions_per_rollout_finishes_under_the_old_version_or_drops_the_group(make_rig) -> None:
    rig = make_rig(["one two", "three four", "five six"])
    run_id, v1, v2 = _two_version_rollout(rig)
    ended = rig.new_rollout()
    rig.store.update_rollout(ended.id, status="scored", reward=0.0)
    # finish_old: at the cap (2 versions spanned) the rollout keeps version 1; an ended rollout is never touched
    assert rig.store.move_live_rollouts(run_id, v2, max_adapters=2, past_cap=False) == (0, 1)
    assert rig.store.get_rollout(rig.rollout.id).adapter == v1 and rig.store.get_rollout(ended.id).adapter is None
    # drop_group: it moves on; its third call is served by version 2 and the trainer drops its group
    assert rig.store.move_live_rollouts(run_id, v2, max_adapters=2, past_cap=True) == (1, 0)
    _chat(rig, [{"role": "user", "content": "again"}])
    assert [c.adapter for c in rig.calls()] == [None, v1, v2]
    assemble_rollout(rig.store, rig.rollout.id)
    rollout = rig.store.update_rollout(rig.rollout.id, status="scored", reward=1.0)
    trajs = rig.store.list_trajectories(rollout_ids=[rollout.id])
    batch = build_batch([rollout], trajs, sampling=call_sampling(rig.store, [rollout.id]), max_versions=2)
    assert batch.version_dropped_groups == 1 and batch.samples == []


class HeldSampler:
    """Each group: one running rollout that waits until the test releases it, then ends scored."""

    def __init__(self, store: Store) -> None:
        self.store, self.release, self.started = store, threading.Event(), threading.Semaphore(0)

    def sample(self, run_id: str, tasks: list, *, step: int, adapter: str | None) -> list[Rollout]:
        r = self.store.create_rollout(run_id=run_id, task_id=tasks[0]["id"], step=step, adapter=adapter,
                                      status="running")
        self.started.release()
        assert self.release.wait(60)
        self.store.replace_trajectories(r.id, [Trajectory(run_id=run_id, rollout_id=r.id, token_ids=[1, 2, 3],
                                                          loss_mask=[0, 1, 1], logprobs=[0.0, -1.0, -1.0],
                                                          n_tokens=3)])
        return [self.store.update_rollout(r.id, status="scored", reward=1.0)]


@pytest.mark.parametrize(("cap", "drop", "moves"), [
    (2, False, True),   # a rollout on its first version moves onto the new adapter
    (1, False, False),  # at the cap, finish_old: it finishes under the version it started with
    (1, True, True),    # at the cap, drop_group: it moves on (and its group will be dropped)
])
def test_publishing_moves_running_groups_onto_the_new_adapter(store: Store, cap: int, drop: bool,
                                                              moves: bool) -> None:
    run = store.create_run(name="partial")
    sampler = HeldSampler(store)
    tasks = [{"id": "a", "instruction": "a"}, {"id": "b", "instruction": "b"}]
    buf = GroupBuffer(sampler, run.id, TaskStream(tasks, seed=0), groups_per_step=1, max_staleness=1, position=0,
                      version=0, adapter=None, end=2, partial=PartialRollouts(store, cap, drop))
    try:
        for _ in range(2):  # K = 1: two groups admitted under version 0
            assert sampler.started.acquire(timeout=30)
        served = adapter_name(run.id, 0)
        buf.publish(1, served)
        live = store.list_rollouts(run.id, status="running")
        assert len(live) == 2 and all(r.adapter == (served if moves else None) for r in live)
        sampler.release.set()
        taken = buf.take(0)
        assert (taken.stats["rollouts_moved"], taken.stats["version_capped"]) == ((2, 0) if moves else (0, 2))
    finally:
        sampler.release.set()
        buf.close()


def test_partial_rollouts_need_the_asynchronous_loop(store: Store, tiny_model) -> None:
    run = store.create_run(name="sync")
    cfg = TrainerConfig(steps=1, tasks_per_step=1, rollout_versions=2)
    with pytest.raises(TrainerError, match="rollout_versions > 1"):
        train(store, run.id, cfg, model_path=tiny_model, tasks=[{"id": "a", "instruction": "a"}],
              sampler=HeldSampler(store))


def test_adapter_versions_follow_the_adapter_names() -> None:
    import doctest

    import openforge.trainer.checkpoint as checkpoint

    result = doctest.testmod(checkpoint)
    assert result.attempted >= 1 and result.failed == 0


class TwoTurnSampler:
    """A two-turn harness, scripted at the proxy's edge: each call is recorded with the adapter the
    rollout has when it is made (what the proxy reads per call). Groups of nominal step 0 answer at
    once; later ones take their second turn only once a newer adapter was published (or fail the test)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def _call(self, r: Rollout, seq: int, prompt: list[int]) -> list[int]:
        completion = [7 + seq, 8 + seq, 9 + seq]
        self.store.add_call(Call(run_id=r.run_id, rollout_id=r.id, seq=seq, api="openai_chat", status="ok",
                                 adapter=self.store.get_rollout(r.id).adapter, prompt_ids=prompt,
                                 completion_ids=completion, logprobs=[-0.5 - seq] * 3,
                                 prompt_tokens=len(prompt), completion_tokens=3))
        return prompt + completion

    def sample(self, run_id: str, tasks: list, *, step: int, adapter: str | None) -> list[Rollout]:
        group = [self.store.create_rollout(run_id=run_id, task_id=tasks[0]["id"], step=step, sample_index=k,
                                           adapter=adapter, status="running") for k in range(2)]
        firsts = [self._call(r, 0, [1, 2, 3, 4, 5]) for r in group]
        for _ in range(600 if step else 0):  # up to 60 s: the trainer publishes the next adapter
            if all(self.store.get_rollout(r.id).adapter != adapter for r in group):
                break
            time.sleep(0.1)
        else:
            assert step == 0, "no newer adapter was published while the rollouts ran"
        out = []
        for k, (r, ids) in enumerate(zip(group, firsts)):
            self._call(r, 1, ids + [2, 2])  # the tool's answer, then the second turn
            assemble_rollout(self.store, r.id)
            out.append(self.store.update_rollout(r.id, status="scored", reward=float(k)))
        return out


def test_the_async_loop_trains_partial_rollouts_with_versions_per_token(store: Store, tiny_model, forge_home) -> None:
    run = store.create_run(name="partial")
    res = train(store, run.id, _cfg(steps=3, max_staleness=1, rollout_versions=2), model_path=tiny_model,
                tasks=TASKS, sampler=TwoTurnSampler(store), home=forge_home)
    first, *later = res.steps
    assert first["spanning_rollouts"] == 0 and first["token_staleness"] == {0: 24}  # 2 groups x 2 rollouts x 6
    for m in later:  # groups started one version back, moved on at the publish: their second turn is current
        assert m["rollouts_moved"] == 4 and m["version_capped"] == 0 and m["spanning_rollouts"] == 4
        assert m["token_staleness"] == {0: 12, 1: 12} and m["staleness"] == {1: 2}
    assert store.get_run(run.id).status == "finished"
