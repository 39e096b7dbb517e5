"""Asynchronous training with bounded staleness (trainer/buffer.py, `trainer.max_staleness`)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from openforge.rollouts.runner.failures import StepFailed
from openforge.store import Rollout, Store
from openforge.trainer.buffer import GroupBuffer
from openforge.trainer.data import build_batch, micro_batches
from openforge.trainer.grpo import StepConfig, grpo_step
from openforge.trainer.loop import TaskStream, train
from openforge.trainer.model import build_optimizer, build_policy
from tests.helpers.trainer import _cfg, ReplaySampler, TASKS, TimedSampler
from tests.helpers.learn import peaked_model  # noqa: F401 - fixture


def _version(run_id: str, adapter: str | None) -> int:
    return 0 if adapter is None else int(adapter.removeprefix(f"{run_id}-step-")) + 1


def _losses(store: Store, run_id: str, tiny_model: Path, batches: list[list[Rollout]]) -> list[float]:
    """The loop's train phase (build_batch -> micro-batches -> one GRPO update) over given batches."""
    torch.manual_seed(0)
    cfg = _cfg()
    model = build_policy(tiny_model, cfg, device=torch.device("cpu"))
    opt, _ = build_optimizer(model, cfg)
    out = []
    for rollouts in batches:
        trajs = store.list_trajectories(rollout_ids=[r.id for r in rollouts])
        batch = build_batch(rollouts, trajs)
        mbs = micro_batches(batch.samples, token_budget=cfg.micro_batch_tokens, pad_id=0, loss_agg=cfg.loss_agg)
        out.append(grpo_step(model, opt, mbs, StepConfig())["loss"])
    return out


def test_staleness_zero_gives_the_synchronous_batches_step_for_step(store: Store, tiny_model: Path) -> None:
    """K = 0: the buffer's batches are the synchronous loop's (same groups, rows, order), so the losses
    are equal step for step; and a group of step s+1 never starts before step s's adapter is published."""
    steps, B = 3, 2
    stream = TaskStream(TASKS, seed=0)
    sync_run = store.create_run()
    sync = ReplaySampler(store)
    sync_batches = [sync.sample(sync_run.id, stream.take(s * B, B), step=s, adapter=None) for s in range(steps)]

    run = store.create_run()
    sampler = TimedSampler(store)
    buf = GroupBuffer(sampler, run.id, stream, groups_per_step=B, max_staleness=0, position=0, version=0,
                      adapter=None, end=steps * B)
    batches = []
    for s in range(steps):
        taken = buf.take(s)
        assert taken.stats["staleness"] == {0: B} and taken.stats["versions_in_flight"] == {}
        batches.append(taken.rollouts)
        buf.publish(s + 1, None)
    buf.close()
    for a, b in zip(sync_batches, batches):
        assert [(r.task_id, r.step, r.sample_index, r.reward) for r in a] == \
            [(r.task_id, r.step, r.sample_index, r.reward) for r in b]
    la, lb = _losses(store, sync_run.id, tiny_model, sync_batches), _losses(store, run.id, tiny_model, batches)
    assert la == pytest.approx(lb, abs=1e-7) and len(set(la)) == steps


@pytest.mark.parametrize("k", [1, 2])
def test_async_loop_trains_every_group_within_the_staleness_bound(store: Store, tiny_model: Path,
                                                                  forge_home: Path, k: int) -> None:
    run = store.create_run()
    sampler = TimedSampler(store, slow=("task-0",), factor=6.0)
    steps = 6
    res = train(store, run.id, _cfg(steps=steps, max_staleness=k), model_path=tiny_model, tasks=TASKS,
                sampler=sampler, home=forge_home)
    assert [s["step"] for s in res.steps] == list(range(steps))
    trained = 0
    for row in store.list_train_steps(run.id):
        hist = {int(a): b for a, b in row.metrics_json["staleness"].items()}
        assert max(hist) <= k and sum(hist.values()) == row.metrics_json["n_groups"]
        trained += sum(hist.values())
    # each rollout carries the adapter it was sampled with; some groups ran ahead of the trainer
    versions = Counter(_version(run.id, r.adapter) for r in store.list_rollouts(run.id))
    assert max(versions) <= steps - 1
    assert trained == steps * 2
    assert any(row.metrics_json["staleness"].get("1") or row.metrics_json["staleness"].get(1)
               for row in store.list_train_steps(run.id))
    assert store.get_run(run.id).status == "finished"


def test_a_slow_task_is_trained_at_its_sampling_rate(store: Store) -> None:
    """Paced admission, not discard-and-requeue: a task 10x slower than the others is trained at the
    share it is sampled at, and never past the staleness bound."""
    run = store.create_run()
    sampler = TimedSampler(store, base_s=0.01, slow=("task-1",), factor=10.0, seed=1)
    steps, B, K = 15, 2, 2
    buf = GroupBuffer(sampler, run.id, TaskStream(TASKS, seed=0), groups_per_step=B, max_staleness=K, position=0,
                      version=0, adapter=None, end=steps * B)
    trained: Counter = Counter()
    waits = 0
    for s in range(steps):
        taken = buf.take(s)
        assert max(taken.stats["staleness"]) <= K
        waits += taken.stats["stale_waits"]
        trained.update(t["id"] for t in taken.tasks)
        time.sleep(0.02)  # the trainer's step
        buf.publish(s + 1, f"{run.id}-step-{s}")
    buf.close()
    sampled = Counter(c[1][0] for c in sampler.calls)
    assert sum(trained.values()) == sum(sampled.values()) == steps * B
    assert sampled["task-1"] >= 4 and waits > 0  # the slow groups reached the bound: waited for, not dropped
    assert trained["task-1"] / (steps * B) == pytest.approx(sampled["task-1"] / (steps * B), abs=0.05)


class FailingSampler(TimedSampler):
    """Every rollout of `bad` tasks' groups fails for infrastructure reasons (StepFailed, as
    RolloutSampler raises it); a group of `crash` raises an engine error instead."""

    def __init__(self, store: Store, bad: tuple[str, ...] = (), crash: str | None = None) -> None:
        super().__init__(store, base_s=0.005)
        self.bad, self.crash = set(bad), crash

    def sample(self, run_id: str, tasks: list, *, step: int, adapter: str | None) -> list[Rollout]:
        if tasks[0]["id"] == self.crash:
            raise ConnectionError("engine gone")
        if tasks[0]["id"] in self.bad:
            raise StepFailed(f"step {step}", 3, "sandbox failed to start", 3)
        return super().sample(run_id, tasks, step=step, adapter=adapter)


def test_failed_groups_are_dropped_and_counted_and_a_sampling_error_ends_the_run(store: Store, tiny_model: Path,
                                                                                  forge_home: Path) -> None:
    run = store.create_run()
    res = train(store, run.id, _cfg(steps=5, max_staleness=1), model_path=tiny_model, tasks=TASKS,
                sampler=FailingSampler(store, bad=("task-2",)), home=forge_home)
    assert sum(s["failed_groups"] for s in res.steps) >= 1
    assert all(s["n_groups"] + s["failed_groups"] >= 1 for s in res.steps)
    crashed = store.create_run()
    with pytest.raises(ConnectionError, match="engine gone"):
        train(store, crashed.id, _cfg(steps=5, max_staleness=1), model_path=tiny_model, tasks=TASKS,
              sampler=FailingSampler(store, crash="task-3"), home=forge_home)
    assert store.get_run(crashed.id).status == "failed"


def test_on_the_real_engine_a_stale_group_keeps_its_adapter_and_behaviour_logprobs(
        tiny_model: Path, store: Store, forge_home: Path) -> None:
    """K = 2 through the embedded engine with each adapter hot-loaded while older groups still sample:
    every rollout is served (no adapter unloaded under a group), groups are trained up to 2 versions
    late, and a group's recorded logprobs are those of the adapter it names, not the newest one: the
    loss's TIS weight is taken against its behaviour policy."""
    from openforge.trainer.adapter_sync import AdapterSync
    from openforge.trainer.bridge import BackgroundLoop
    from openforge.trainer.grpo import token_logprobs
    from openforge.trainer.samplers import EngineSampler
    from tests.helpers.learn import _prompts, embedded_engine

    cfg = _cfg(steps=5, tasks_per_step=2, max_staleness=2, lr=5e-2, micro_batch_tokens=4096)
    run = store.create_run()
    bridge = BackgroundLoop()
    with embedded_engine(tiny_model) as client:
        sampler = EngineSampler(client, store, bridge, reward_fn=lambda _t, c: float(c[0] % 2), group_size=3,
                                max_new_tokens=6)
        res = train(store, run.id, cfg, model_path=tiny_model, tasks=_prompts(tiny_model), sampler=sampler,
                    engine=AdapterSync(client, bridge), home=forge_home)
        bridge.run(client.aclose())
    bridge.close()
    assert max(max(int(k) for k in s["staleness"]) for s in res.steps) == 2
    rollouts = store.list_rollouts(run.id)
    assert all(r.status == "scored" for r in rollouts)
    old = next(r for r in rollouts if r.adapter == f"{run.id}-step-0")
    traj = store.list_trajectories(rollout_ids=[old.id])[0]
    ids = torch.tensor([traj.token_ids])
    first = traj.loss_mask.index(1)
    recorded = torch.tensor(traj.logprobs[first:])

    def logprobs_under(step: int) -> torch.Tensor:
        model = build_policy(tiny_model, cfg, device=torch.device("cpu"),
                             resume_from=forge_home / "runs" / run.id / "adapters" / f"step-{step}")
        with torch.no_grad():
            return token_logprobs(model, ids, torch.ones_like(ids), first=first)[0, first - 1:]

    assert torch.allclose(logprobs_under(0), recorded, atol=1e-4)
    assert (logprobs_under(cfg.steps - 1) - recorded).abs().max() > 1e-3


def test_forge_show_prints_the_staleness_of_an_async_run(store: Store, tiny_model: Path, forge_home: Path) -> None:
    from typer.testing import CliRunner

    from openforge.forge_cli.main import app

    run = store.create_run()
    train(store, run.id, _cfg(steps=3, max_staleness=1), model_path=tiny_model, tasks=TASKS,
          sampler=TimedSampler(store), home=forge_home)
    res = CliRunner().invoke(app, ["show", run.id], catch_exceptions=False)
    out = " ".join(res.stdout.split())  # as one line, whatever the terminal's width wrapped
    assert res.exit_code == 0
    assert "async: groups by versions behind 0:2 1:4;" in out
    assert "buffer depth 0, in flight none" in out  # the run's end: nothing left to sample
    sync = store.create_run()
    train(store, sync.id, _cfg(steps=1), model_path=tiny_model, tasks=TASKS, sampler=ReplaySampler(store),
          home=forge_home)
    assert "async:" not in CliRunner().invoke(app, ["show", sync.id], catch_exceptions=False).stdout


def test_a_stopped_async_run_resumes_with_every_step_once(store: Store, tiny_model: Path, forge_home: Path) -> None:
    run = store.create_run()
    with pytest.raises(KeyboardInterrupt):  # a group of nominal step 3 is stopped (Ctrl-C while sampling)
        train(store, run.id, _cfg(steps=5, max_staleness=1), model_path=tiny_model, tasks=TASKS,
              sampler=ReplaySampler(store, stop_at=3), home=forge_home)
    assert store.get_run(run.id).status == "stopped"
    done = [s.step for s in store.list_train_steps(run.id)]
    assert done and done == list(range(len(done))) and len(done) < 5
    train(store, run.id, _cfg(steps=5, max_staleness=1), model_path=tiny_model, tasks=TASKS,
          sampler=ReplaySampler(store), home=forge_home, resume=True)
    assert [s.step for s in store.list_train_steps(run.id)] == [0, 1, 2, 3, 4]
    assert store.get_run(run.id).status == "finished"


@pytest.mark.slow
def test_it_learns_under_staleness_two(peaked_model: tuple[Path, int, float], store: Store, forge_home: Path) -> None:
    """test_learn.py's run (the real embedded engine, the adapter hot-loaded every step) with
    max_staleness = 2: the reward rises as it does synchronously (same threshold)."""
    from openforge.config import TrainerConfig
    from openforge.trainer.adapter_sync import AdapterSync
    from openforge.trainer.bridge import BackgroundLoop
    from openforge.trainer.samplers import EngineSampler
    from tests.helpers.learn import NEW_TOKENS, _prompts, embedded_engine

    model_dir, target, _ = peaked_model
    cfg = TrainerConfig(steps=14, tasks_per_step=4, lr=1e-2, lora_r=8, lora_alpha=16, micro_batch_tokens=4096,
                        seed=0, tis_cap=2.0, max_staleness=2)
    run = store.create_run(kind="train", name="learn-async")
    bridge = BackgroundLoop()
    with embedded_engine(model_dir) as client:
        sampler = EngineSampler(client, store, bridge, group_size=8, max_new_tokens=NEW_TOKENS, temperature=1.0,
                                reward_fn=lambda _t, c: sum(1 for t in c if t == target) / NEW_TOKENS)
        result = train(store, run.id, cfg, model_path=model_dir, tasks=_prompts(model_dir), sampler=sampler,
                       engine=AdapterSync(client, bridge), home=forge_home)
        bridge.run(client.aclose())
    bridge.close()
    curve = [m["reward_mean"] for m in result.steps]
    print(f"\nreward curve under max_staleness 2: {[round(r, 3) for r in curve]}")
    assert sum(curve[-3:]) / 3 > sum(curve[:3]) / 3 + 0.15, curve
    assert max(max(int(k) for k in m["staleness"]) for m in result.steps) == 2
