"""Real-architecture checkpoints with random weights, built here (no hub): the shapes of Qwen3-1.7B and
Qwen2.5-7B (their config.json's sizes), saved in bf16 with the tiny model's tokenizer, so the engine and
the trainer load them with the same code that loads a downloaded checkpoint.

The tokenizer is engine/tiny.py's (1,033 tokens, the family's real chat template); the model keeps the
real vocabulary (151,936 / 152,064 rows), so embedding, LM head and sampling cost what they cost on
the real model. Sampled ids past the tokenizer's are fine for every measurement here (ignore_eos,
token ids in, token ids out); only text decoding drops them.
"""

from __future__ import annotations

from pathlib import Path

# From each model's config.json on the hub (Qwen/Qwen3-1.7B, Qwen/Qwen2.5-7B-Instruct).
SHAPES: dict[str, dict] = {
    "qwen3-1.7b": dict(model_type="qwen3", hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                       max_position_embeddings=40960, tie_word_embeddings=True, rms_norm_eps=1e-6),
    "qwen2.5-7b": dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                       max_position_embeddings=32768, tie_word_embeddings=False, rms_norm_eps=1e-6),
}
TEMPLATES = {"qwen3": "qwen3", "qwen2": "qwen2.5"}  # model_type -> engine/tiny.py TEMPLATES key

# --dry-run: the same architectures at toy size. The vocabulary stays larger than the tokenizer's, as
# on the real shapes, so ids the tokenizer lacks flow through every part of the dry run too.
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=2048)


def shape(name: str, *, tiny: bool) -> dict:
    """The config values of `name` (a SHAPES key); `tiny`: the same model type at toy size."""
    full = SHAPES[name]
    if not tiny:
        return dict(full)
    return {**full, **TINY, **({"head_dim": 16} if "head_dim" in full else {})}


def build_checkpoint(name: str, path: Path, *, tiny: bool, device: str, seed: int = 0) -> Path:
    """Write a random-weight `name` checkpoint (bf16) with tokenizer and generation config to `path`.

    The weights are drawn on `device` (a 7B init on a GPU takes seconds, on a CPU minutes)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
    from transformers.utils import logging as hf_logging

    from openforge.engine.tiny import build_tokenizer

    hf_logging.disable_progress_bar()
    values = shape(name, tiny=tiny)
    tokenizer = build_tokenizer(1024, TEMPLATES[values["model_type"]])
    eos, pad = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = AutoConfig.for_model(**values, eos_token_id=eos, pad_token_id=pad, bos_token_id=None)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config = GenerationConfig(eos_token_id=[eos, pad], pad_token_id=pad)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return path


def parameters(path: Path) -> int:
    """Parameters of the checkpoint at `path`, from its safetensors headers (no weights read)."""
    import json
    import struct

    total = 0
    for f in sorted(path.glob("*.safetensors")):
        with f.open("rb") as fh:
            header = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
        for key, meta in header.items():
            if key != "__metadata__":
                n = 1
                for d in meta["shape"]:
                    n *= d
                total += n
    return total
