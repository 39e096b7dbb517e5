"""The learning tests' model and engine: a tiny model whose output is peaked on one token, the prompts it is
trained on, and the embedded engine serving it."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import pytest

from openforge.config import EmbeddedEngineConfig


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
