"""It learns: the tiny random-weight Qwen2 with LoRA raises a reward with GRPO, sampling through an
engine with the adapter hot-loaded every step; the engine/trainer logprob mismatch is ~0 in fp32."""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from openforge.config import EmbeddedEngineConfig, TrainerConfig
from openforge.trainer.loop import train
from openforge.trainer.adapter_sync import AdapterSync
from openforge.trainer.bridge import BackgroundLoop
from openforge.trainer.samplers import EngineSampler

NEW_TOKENS = 8
NORM_GAIN = 5.0


@pytest.fixture(scope="module")
def peaked_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, float]:
    """The tiny model with a sharper output distribution, the token the reward asks for, and that
    token's base probability at the first answer position (mean over the prompts).

    At the random init every next-token distribution is near uniform over ~1k tokens and no adapter
    can change that much: the final RMSNorm fixes |h| = sqrt(d) * gain, so a logit h.e moves by at
    most ~1.3. Raising the final norm's gain gives the peaked distributions of a trained LM, which a
    LoRA on the attention/MLP can steer (the residual stream is untouched). The target is a token the
    base model does NOT favour: the second most likely at the first answer position (under 1% there,
    the favourite, a newline, ~24%), so a rise is the policy moving, not the base model's habit; it is
    sampled often enough over 8 tokens x 48 rollouts a step that GRPO has signal from the first step."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("peaked") / "tiny"
    shutil.copytree(tiny_model, out)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight.mul_(NORM_GAIN)
        probs = sum(torch.softmax(model(input_ids=torch.tensor([t["prompt_ids"]])).logits[0, -1], -1)
                    for t in _prompts(tiny_model))
    model.save_pretrained(out)
    probs = probs / len(_prompts(tiny_model))
    favourite, target = probs.topk(2).indices.tolist()
    assert probs[target] < probs[favourite] / 10  # not the base model's preference
    return out, target, float(probs[target])


def _prompts(model_dir: Path) -> list[dict]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    words = ["hello", "list files", "count lines", "fix the test", "print json", "make a folder"]
    return [{"id": f"t{i}", "prompt_ids": tok.apply_chat_template([{"role": "user", "content": w}],
                                                                   add_generation_prompt=True, tokenize=True)["input_ids"]}
            for i, w in enumerate(words)]


@contextmanager
def embedded_engine(model_dir: Path):
    """The real embedded engine on loopback (fp32, CPU, seeded) and a client for it."""
    from openforge.engine.client import EngineClient
    from openforge.engine.embedded import create_engine_app
    from openforge.engine.serve import serve_in_thread

    app = create_engine_app(EmbeddedEngineConfig(model=str(model_dir), dtype="float32", device="cpu", seed=0))
    with serve_in_thread(app) as server:
        yield EngineClient(server.url, timeout=60)


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
