"""Embedded engine throughput: generated tokens/s at batch 1 and batch 8, over real loopback HTTP.

Baseline, same run, same model, same prompts: a plain `model.generate` loop (greedy, KV cache), one
prompt at a time for batch 1, and for batch 8 one `model.generate` call on the 8 left-padded prompts
(static batching, the best plain transformers does). Measured: 1 or 8 concurrent /generate requests
to the embedded engine through EngineClient (continuous batching). Medians over repeats.

The model is a random Qwen2 built here (no hub): hidden 256, 4 layers (quick: the 64-wide tiny model).
On tiny models per-step Python overhead dominates, so ratios here say more about overhead than FLOPs.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import torch

from openforge.engine.client import EngineClient
from openforge.engine.embedded import EmbeddedEngine
from openforge.engine.serve import serve_in_thread
from openforge.engine.tiny import build_tiny_model
from openforge.config import EmbeddedEngineConfig

PARAMS = {"temperature": 0, "ignore_eos": True}


def _prompts(tokenizer, n: int) -> list[list[int]]:
    texts = ["count the lines in data.txt", "write hello to a file", "run the tests", "list the folder",
             "fix the bug in the script", "print the version", "sort the numbers", "make a directory"]
    return [list(tokenizer.apply_chat_template([{"role": "user", "content": texts[i % len(texts)]}],
                                               add_generation_prompt=True, tokenize=True, return_dict=False))
            for i in range(n)]


def _hf_tokens_per_s(model, tokenizer, prompts: list[list[int]], new_tokens: int) -> float:
    """model.generate on all `prompts` at once (left-padded), greedy, no early stop."""
    pad = tokenizer.pad_token_id
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=pad)
    elapsed = time.perf_counter() - start
    return (out.shape[1] - width) * len(prompts) / elapsed


async def _engine_tokens_per_s(url: str, prompts: list[list[int]], new_tokens: int) -> float:
    async with EngineClient(url) as client:
        start = time.perf_counter()
        outs = await asyncio.gather(*[client.generate(p, {**PARAMS, "max_new_tokens": new_tokens}) for p in prompts])
        elapsed = time.perf_counter() - start
    return sum(len(o.output_ids) for o in outs) / elapsed


def run(quick: bool = False) -> dict:
    # Same intra-op threads for both sides; 1 is what `forge engine` picks for a model this small.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(quick)
    finally:
        torch.set_num_threads(threads)


def _run(quick: bool) -> dict:
    new_tokens = 16 if quick else 64
    repeats = 2 if quick else 5
    size = {"hidden_size": 64, "layers": 2} if quick else {"hidden_size": 256, "layers": 4}
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_model(Path(tmp) / "model", **size)
        return {"model": size, "torch_threads": 1, **measure(path, new_tokens=new_tokens, repeats=repeats)}


def measure(path: Path, *, new_tokens: int, repeats: int) -> dict:
    """Decode tokens/s of the embedded engine and of `model.generate` on the checkpoint at `path`, batch 1
    and 8, the same prompts, interleaved (bench/real_model.py runs it on a pulled real model)."""
    results: dict = {"new_tokens": new_tokens, "repeats": repeats}
    engine = EmbeddedEngine(EmbeddedEngineConfig(model=str(path), max_batch_size=8))
    model, tok = engine.m.model, engine.m.tokenizer
    with serve_in_thread(engine.app) as server:
        asyncio.run(_engine_tokens_per_s(server.url, _prompts(tok, 2), 4))  # warm up both paths
        _hf_tokens_per_s(model, tok, _prompts(tok, 2), 4)
        for batch in (1, 8):
            prompts = _prompts(tok, batch)
            hf, emb = [], []
            for _ in range(repeats):
                if batch == 1:
                    hf.append(statistics.mean(_hf_tokens_per_s(model, tok, [p], new_tokens) for p in prompts))
                else:
                    hf.append(_hf_tokens_per_s(model, tok, prompts, new_tokens))
                emb.append(asyncio.run(_engine_tokens_per_s(server.url, prompts, new_tokens)))
            row = {"engine_tokens_per_s": statistics.median(emb), "hf_generate_tokens_per_s": statistics.median(hf)}
            row["ratio_engine_vs_hf"] = row["engine_tokens_per_s"] / row["hf_generate_tokens_per_s"]
            results[f"batch_{batch}"] = row
            print(f"batch {batch}: embedded engine {row['engine_tokens_per_s']:.0f} tok/s, "
                  f"model.generate {row['hf_generate_tokens_per_s']:.0f} tok/s, "
                  f"ratio {row['ratio_engine_vs_hf']:.2f}x", flush=True)
    engine.close()
    b1, b8 = results["batch_1"], results["batch_8"]
    results["engine_batch8_vs_batch1"] = b8["engine_tokens_per_s"] / b1["engine_tokens_per_s"]
    print(f"engine scaling batch 8 / batch 1: {results['engine_batch8_vs_batch1']:.2f}x", flush=True)
    return results
