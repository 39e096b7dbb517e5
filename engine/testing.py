"""Model fixtures for tests of any part: a tiny model whose outputs depend on its input, and a LoRA.

The tiny model's default init (std 0.02) gives near-uniform logits, so greedy decoding repeats one
token whatever the prompt and tests of "greedy equals greedy" would pass vacuously. `make_peaky_model`
re-draws the weights wider, so different prompts, adapters and weights give different tokens.
"""

from __future__ import annotations

from pathlib import Path


def make_peaky_model(src: str | Path, dst: str | Path, *, seed: int = 1, std: float = 0.35) -> Path:
    """Copy the checkpoint at `src` to `dst` with every non-norm weight re-drawn from N(0, std)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.copy_(torch.randn(param.shape, generator=gen) * std)
    out = Path(dst)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(str(src)).save_pretrained(out)
    return out


def make_random_lora(model_dir: str | Path, dst: str | Path, *, seed: int = 0, r: int = 4, scale: float = 0.5,
                     target_modules: tuple[str, ...] = ("q_proj", "v_proj", "o_proj", "down_proj")) -> Path:
    """Save a PEFT LoRA adapter for `model_dir` with non-zero A and B (so it changes outputs)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    peft = get_peft_model(base, LoraConfig(r=r, lora_alpha=r, target_modules=list(target_modules), lora_dropout=0.0))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * scale)
    out = Path(dst)
    peft.save_pretrained(out)
    return out
