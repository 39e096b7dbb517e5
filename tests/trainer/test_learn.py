"""It learns: the tiny random-weight Qwen2 with LoRA raises a reward with GRPO, sampling through an
engine with the adapter hot-loaded every step; the engine/trainer logprob mismatch is ~0 in fp32."""

from __future__ import annotations

import time
from pathlib import Path


from openforge.config import TrainerConfig
from openforge.trainer.loop import train
from openforge.trainer.adapter_sync import AdapterSync
from openforge.trainer.bridge import BackgroundLoop
from openforge.trainer.samplers import EngineSampler
from tests.helpers.learn import NEW_TOKENS, _prompts, embedded_engine, peaked_model  # noqa: F401 - fixtures


def test_grpo_learns_target_tokens_with_lora(peaked_model: tuple[Path, int, float], store, forge_home: Path) -> None:
    model_dir, target, base_share = peaked_model

    def target_share(_task: object, completion: list[int]) -> float:
        return sum(1 for t in completion if t == target) / NEW_TOKENS

    cfg = TrainerConfig(steps=14, tasks_per_step=4, lr=1e-2, lora_r=8, lora_alpha=16, micro_batch_tokens=4096,
                        seed=0, tis_cap=2.0)
    run = store.create_run(kind="train", name="learn")
    bridge = BackgroundLoop()
    with embedded_engine(model_dir) as client:
        sampler = EngineSampler(client, store, bridge, reward_fn=target_share, group_size=8,
                                max_new_tokens=NEW_TOKENS, temperature=1.0)
        t0 = time.perf_counter()
        result = train(store, run.id, cfg, model_path=model_dir, tasks=_prompts(model_dir), sampler=sampler,
                       engine=AdapterSync(client, bridge), home=forge_home)
        wall = time.perf_counter() - t0
        bridge.run(client.aclose())
    bridge.close()
    curve = [m["reward_mean"] for m in result.steps]
    mism = max(m["mismatch_max"] for m in result.steps)
    print(f"\nreward curve: {[round(r, 3) for r in curve]}  (target's base share {base_share:.3f})  "
          f"max mismatch {mism:.2e}  wall {wall:.1f}s")
    start, end = sum(curve[:3]) / 3, sum(curve[-3:]) / 3
    assert end > start + 0.15, curve
    assert mism < 1e-4  # fp32 engine and fp32 trainer compute the same logprobs
    rows = store.list_train_steps(run.id)
    assert [r.step for r in rows] == list(range(cfg.steps))
    assert store.get_run(run.id).current_adapter == f"{run.id}-step-{cfg.steps - 1}"
    # every step after the first sampled with the adapter of the step before
    rollouts = store.list_rollouts(run.id)
    assert {r.adapter for r in rollouts if r.step == 5} == {f"{run.id}-step-4"}
    assert {r.adapter for r in rollouts if r.step == 0} == {None}
