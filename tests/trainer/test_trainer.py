"""The trainer beyond the math: store rows -> batches, micro-batching, the loop, checkpoint/resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from sqlalchemy import text

from openforge.config import TrainerConfig
from openforge.errors import TrainerError
from openforge.store import Rollout, Store, Trajectory
from openforge.trainer.data import build_batch, micro_batches
from openforge.trainer.grpo import StepConfig, grpo_step
from openforge.trainer.loop import TaskStream, train
from openforge.trainer.model import build_optimizer, build_policy
from tests.helpers.trainer import ReplaySampler, TASKS, _cfg, _lora_state, _samples


def _rollout(store: Store, run_id: str, task: str, status: str, reward: float | None) -> Rollout:
    r = store.create_rollout(run_id=run_id, task_id=task)
    return store.update_rollout(r.id, status=status, reward=reward)


def test_build_batch_drops_groups_with_infrastructure_failures_and_keeps_every_segment(store: Store) -> None:
    run = store.create_run()
    ok = [_rollout(store, run.id, "a", "scored", rw) for rw in (1.0, 0.0)]
    bad = [_rollout(store, run.id, "b", "scored", 1.0), _rollout(store, run.id, "b", "failed", None)]
    late = [_rollout(store, run.id, "c", "timed_out", 0.0), _rollout(store, run.id, "c", "scored", 0.5)]
    trajs = []
    for r in ok + bad + late:
        for seg in range(2 if r is ok[0] else 1):
            trajs.append(Trajectory(run_id=run.id, rollout_id=r.id, segment=seg, token_ids=[1, 2, 3],
                                    loss_mask=[0, 1, 1], logprobs=[0.0, -1.0, -2.0]))
    batch = build_batch(ok + bad + late, trajs, std_normalize=False)
    assert batch.dropped_groups == 1 and set(batch.dropped_rollouts) == {r.id for r in bad}
    assert batch.n_groups == 2
    by = {(s.rollout_id, s.segment): s.advantage for s in batch.samples}
    assert by[(ok[0].id, 0)] == by[(ok[0].id, 1)] == pytest.approx(0.5)  # both segments, same advantage
    assert by[(ok[1].id, 0)] == pytest.approx(-0.5)
    assert by[(late[0].id, 0)] == pytest.approx(-0.25)  # a scored time-out is data


def test_inconsistent_trajectory_is_one_clear_error(store: Store) -> None:
    run = store.create_run()
    r = _rollout(store, run.id, "a", "scored", 1.0)
    bad = Trajectory(run_id=run.id, rollout_id=r.id, token_ids=[1, 2], loss_mask=[0, 1, 1], logprobs=[0, 0])
    with pytest.raises(TrainerError, match="inconsistent"):
        build_batch([r], [bad])


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean"])
def test_micro_batching_gives_the_full_batch_gradient(tiny_model: Path, loss_agg: str) -> None:
    samples = _samples(7)
    small = micro_batches(samples, token_budget=24, pad_id=0, loss_agg=loss_agg)
    assert len(small) > 2
    assert all(mb["input_ids"].numel() <= 24 or mb["input_ids"].shape[0] == 1 for mb in small)
    total_w = sum(float((mb["weights"] * mb["mask"]).sum()) for mb in small)
    assert total_w == pytest.approx(1.0)
    grads = []
    for mbs in (micro_batches(samples, token_budget=10_000, pad_id=0, loss_agg=loss_agg), small):
        torch.manual_seed(0)
        model = build_policy(tiny_model, _cfg(), device=torch.device("cpu"))
        opt, _ = build_optimizer(model, _cfg())
        # lr ~0: compare the gradients that the step accumulated, not the update
        for g in opt.param_groups:
            g["lr"] = 0.0
        grpo_step(model, opt, mbs, StepConfig(max_grad_norm=1e9))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert grads[0].abs().sum() > 0
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_task_stream_is_seeded_and_covers_every_task_each_pass() -> None:
    s = TaskStream(TASKS, seed=3)
    first = [t["id"] for t in s.take(0, 5)]
    assert sorted(first) == sorted(t["id"] for t in TASKS)
    assert s.take(2, 4) == TaskStream(TASKS, seed=3).take(2, 4)
    assert [t["id"] for t in s.take(0, 5)] != [t["id"] for t in TaskStream(TASKS, seed=4).take(0, 5)]


def test_loop_records_metrics_checkpoints_and_serves_each_new_adapter(store: Store, tiny_model: Path,
                                                                       forge_home: Path) -> None:
    run = store.create_run()
    sampler = ReplaySampler(store, segments=2)
    result = train(store, run.id, _cfg(steps=3), model_path=tiny_model, tasks=TASKS, sampler=sampler, home=forge_home)
    assert [c[2] for c in sampler.calls] == [None, f"{run.id}-step-0", f"{run.id}-step-1"]
    rows = store.list_train_steps(run.id)
    assert [r.step for r in rows] == [0, 1, 2]
    for r in rows:
        assert r.n_tokens == 2 * 3 * 2 * 4 and r.n_rollouts == 6 and r.grad_norm > 0
        assert r.reward_mean is not None and r.pass_rate is not None
        assert r.mismatch_max >= r.mismatch_mean > 3.0  # replayed logprobs -3 vs ~log(1/1000) here
        assert r.t_rollout_s >= 0 and r.t_train_s > 0 and r.t_sync_s >= 0 and r.tokens_per_s > 0
    assert [c.step for c in store.list_checkpoints(run.id)] == [0, 1, 2]
    assert store.get_run(run.id).status == "finished"
    assert result.adapter == store.get_run(run.id).current_adapter == f"{run.id}-step-2"


def test_killed_run_resumes_with_no_lost_or_repeated_step(store: Store, tiny_model: Path, forge_home: Path) -> None:
    ref = store.create_run()
    ref_sampler = ReplaySampler(store)
    train(store, ref.id, _cfg(steps=5), model_path=tiny_model, tasks=TASKS, sampler=ref_sampler, home=forge_home)

    run = store.create_run()
    with pytest.raises(KeyboardInterrupt):
        train(store, run.id, _cfg(steps=5), model_path=tiny_model, tasks=TASKS,
              sampler=ReplaySampler(store, stop_at=3), home=forge_home)
    assert store.get_run(run.id).status == "stopped"
    # The kill came just after step 2's checkpoint, before its metrics row was written.
    with store.session() as s:
        s.connection().execute(text("DELETE FROM trainstep WHERE run_id=:r AND step=2"), {"r": run.id})
        s.commit()
    with pytest.raises(TrainerError, match="--resume"):
        train(store, run.id, _cfg(steps=5), model_path=tiny_model, tasks=TASKS, sampler=ReplaySampler(store),
              home=forge_home)

    resumed = ReplaySampler(store)
    train(store, run.id, _cfg(steps=5), model_path=tiny_model, tasks=TASKS, sampler=resumed, home=forge_home,
          resume=True)
    assert [c[0] for c in resumed.calls] == [3, 4]
    assert [s.step for s in store.list_train_steps(run.id)] == [0, 1, 2, 3, 4]
    # Same tasks at the same steps, and the same weights, as the run that was never interrupted.
    assert [c[1] for c in resumed.calls] == [c[1] for c in ref_sampler.calls[3:]]
    a, b = _lora_state(forge_home, ref.id, 4), _lora_state(forge_home, run.id, 4)
    assert a.keys() == b.keys()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert any(a[k].abs().sum() > 0 for k in a if "lora_B" in k)


def test_overlap_samples_the_next_step_with_the_previous_adapter(store: Store, tiny_model: Path,
                                                                 forge_home: Path) -> None:
    """`overlap` is max_staleness = 1 (the asynchronous buffer, one group per sampler call): step N+1's
    groups are sampled by step N-1's adapter while step N trains."""
    assert _cfg(overlap=True).max_staleness == 1 and _cfg(overlap=True, max_staleness=2).max_staleness == 2
    run = store.create_run()
    sampler = ReplaySampler(store)
    train(store, run.id, _cfg(steps=3, overlap=True), model_path=tiny_model, tasks=TASKS, sampler=sampler,
          home=forge_home)
    assert sorted(((c[0], c[2]) for c in sampler.calls), key=str) == \
        [(0, None)] * 2 + [(1, None)] * 2 + [(2, f"{run.id}-step-0")] * 2
    assert [s.step for s in store.list_train_steps(run.id)] == [0, 1, 2]


def test_kl_to_the_adapter_free_reference_and_full_finetune(store: Store, tiny_model: Path, forge_home: Path) -> None:
    run = store.create_run()
    res = train(store, run.id, _cfg(steps=2, kl_coef=0.1, epochs_per_step=2), model_path=tiny_model, tasks=TASKS,
                sampler=ReplaySampler(store), home=forge_home)
    assert res.steps[0]["kl"] == pytest.approx(0.0, abs=1e-9)  # the adapter starts as a no-op
    assert res.steps[1]["kl"] > 0
    full = store.create_run()
    res = train(store, full.id, _cfg(steps=1, full_finetune=True, lr=1e-4), model_path=tiny_model, tasks=TASKS,
                sampler=ReplaySampler(store), home=forge_home)
    assert (forge_home / "runs" / full.id / "adapters" / "step-0" / "config.json").is_file()
    assert store.get_run(full.id).current_adapter is None  # the engine's base weights are replaced
    with pytest.raises(TrainerError, match="LoRA"):
        train(store, store.create_run().id, _cfg(steps=1, full_finetune=True, kl_coef=0.1), model_path=tiny_model,
              tasks=TASKS, sampler=ReplaySampler(store), home=forge_home)


def test_adapter_sync_keeps_two_replaces_a_held_name_and_reports_a_bad_path(tiny_model: Path, forge_home: Path) -> None:
    from openforge.engine.embedded import create_engine_app
    from openforge.engine.serve import serve_in_thread
    from openforge.config import EmbeddedEngineConfig
    from openforge.errors import EngineError
    from openforge.trainer.adapter_sync import AdapterSync
    from openforge.trainer.bridge import BackgroundLoop

    model = build_policy(tiny_model, _cfg(), device=torch.device("cpu"))
    model.save_pretrained(forge_home / "a")
    bridge = BackgroundLoop()
    app = create_engine_app(EmbeddedEngineConfig(model=str(tiny_model), dtype="float32", device="cpu"))
    with serve_in_thread(app) as server:
        client = bridge.run(_make_client(server.url))
        sync = AdapterSync(client, bridge)
        for name in ("s0", "s1", "s2"):
            sync.load(name, str(forge_home / "a"))
        assert sync.loaded == ["s1", "s2"]
        assert set(app.state.engine.scheduler.adapters.paths) == {"s1", "s2"}
        AdapterSync(client, bridge).load("s2", str(forge_home / "a"))  # held from before a resume: replaced
        with pytest.raises(EngineError, match="load_lora_adapter"):
            sync.load("s3", str(forge_home / "missing"))
        bridge.run(client.aclose())
    bridge.close()


async def _make_client(url: str):
    from openforge.engine.client import EngineClient

    return EngineClient(url, timeout=30)


def test_pass_rate_uses_each_tasks_threshold() -> None:
    from openforge.trainer.data import Batch
    from openforge.trainer.loop import _reward_metrics

    batch = Batch(samples=[], rewards=[0.0, 0.5, 1.0, 0.5], task_ids=["easy", "easy", "hard", "hard"])
    m = _reward_metrics(batch, [{"id": "easy", "pass_threshold": 0.0}, {"id": "hard"}])
    assert m["pass_rate"] == pytest.approx(3 / 4)  # both easy ones pass at 0; hard passes only at 1.0
    assert m["reward_mean"] == pytest.approx(0.5) and m["reward_std"] == pytest.approx(0.3535534)


def test_data_docstring_examples_hold() -> None:
    import doctest

    from openforge.trainer import data as trainer_data

    result = doctest.testmod(trainer_data)
    assert result.attempted >= 1 and result.failed == 0


def test_step_config_is_the_trainer_configs_and_its_defaults_are_trainerconfigs() -> None:
    assert StepConfig.from_trainer(TrainerConfig(), None) == StepConfig()  # hand-built steps train as a run does
    cfg = TrainerConfig(clip_eps=0.1, clip_eps_high=0.3, tis_cap=4.0, kl_coef=0.05, loss_agg="seq-mean",
                        max_grad_norm=0.5, epochs_per_step=3)
    assert StepConfig.from_trainer(cfg, torch.bfloat16) == StepConfig(
        clip_eps=0.1, clip_eps_high=0.3, tis_cap=4.0, kl_coef=0.05, loss_agg="seq-mean", max_grad_norm=0.5,
        epochs=3, autocast_dtype=torch.bfloat16)
