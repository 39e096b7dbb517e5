"""The engine's parts of the GPU check, each against its baseline in the same process: decode tokens/s
vs `model.generate` (bench/engine.py's two loops), the prefix cache on Claude Code's recorded first
request (bench/prefix_cache.py's group), a GRPO batch sampled with the engine's logprobs (what the
trainer's parts train on), and LoRA hot-load latency through the trainer's own AdapterSync."""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

from bench.engine import _engine_tokens_per_s, _hf_tokens_per_s, _prompts
from bench.prefix_cache import GROUP, _computed, _group, claude_code_prompt
from bench.trainer import PROMPTS, _reward


def decode(engine: Any, url: str, *, batches: tuple[int, ...], new_tokens: int, repeats: int) -> list[dict]:
    """Generated tokens/s at each batch size: the engine (concurrent /generate requests, continuous
    batching) vs one `model.generate` call on the same left-padded prompts (static batching), greedy,
    no early stop; medians over `repeats`, after one warm-up of each."""
    model, tok = engine.m.model, engine.m.tokenizer
    asyncio.run(_engine_tokens_per_s(url, _prompts(tok, 2), 4))
    _hf_tokens_per_s(model, tok, _prompts(tok, 2), 4)
    rows = []
    for batch in batches:
        prompts = _prompts(tok, batch)
        hf, emb = [], []
        for _ in range(repeats):
            hf.append(_hf_tokens_per_s(model, tok, prompts, new_tokens))
            emb.append(asyncio.run(_engine_tokens_per_s(url, prompts, new_tokens)))
        row = {"batch": batch, "engine_tokens_per_s": round(statistics.median(emb), 1),
               "generate_tokens_per_s": round(statistics.median(hf), 1)}
        row["ratio"] = round(row["engine_tokens_per_s"] / row["generate_tokens_per_s"], 3)
        rows.append(row)
        print(f"  decode batch {batch}: engine {row['engine_tokens_per_s']:,.0f} tok/s, model.generate "
              f"{row['generate_tokens_per_s']:,.0f} tok/s ({row['ratio']:.2f}x)", flush=True)
    return rows


def kv_bytes_per_token(model: Any) -> int:
    """Bytes of K and V one token adds to the cache (all layers) in the model's dtype."""
    c = model.config.get_text_config()
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return c.num_hidden_layers * 2 * c.num_key_value_heads * head_dim * next(model.parameters()).element_size()


def prefix_cache(m: Any, *, tokens: int | None) -> dict:
    """A GRPO group of 8 /generate requests on Claude Code's first request (its first `tokens` tokens,
    None: all), 8 new tokens each, on an engine with the prefix cache and on one without (both share
    the loaded model `m`): prefill tokens computed (the engine's own counter) and the group's wall time."""
    from openforge.config import EmbeddedEngineConfig
    from openforge.engine.embedded import EmbeddedEngine
    from openforge.engine.serve import serve_in_thread

    prompt = claude_code_prompt(m.tokenizer)
    ids = prompt[:tokens] if tokens else prompt
    # room for the prompt's KV twice over: the group's cached prefix is never evicted mid-group
    cache_mb = max(512, math.ceil(2 * len(ids) * kv_bytes_per_token(m.model) / 2**20))
    engines = {side: EmbeddedEngine(EmbeddedEngineConfig(model=str(m.path), prefix_cache_mb=mb, max_batch_size=GROUP),
                                    loaded=m) for side, mb in (("off", 0), ("on", cache_mb))}
    out: dict[str, Any] = {"group": GROUP, "prompt_tokens": len(ids), "recorded_prompt_tokens": len(prompt),
                           "prefix_cache_mb": cache_mb}
    try:
        for side in ("off", "on"):
            with serve_in_thread(engines[side].app) as server:
                before = _computed(engines[side])
                wall, latencies, outs = asyncio.run(_group(server.url, ids))
            out[f"cache_{side}"] = {"wall_s": round(wall, 3), "median_rollout_s": round(statistics.median(latencies), 3),
                                    "prefill_tokens_computed": _computed(engines[side]) - before,
                                    "cached_tokens": sum(o["meta_info"]["cached_tokens"] for o in outs)}
    finally:
        for engine in engines.values():
            engine.close()
            engine.scheduler.flush_prefix_cache()
    on, off = out["cache_on"], out["cache_off"]
    out["prefill_tokens_ratio_off_vs_on"] = round(off["prefill_tokens_computed"] / max(on["prefill_tokens_computed"], 1), 2)
    out["wall_ratio_off_vs_on"] = round(off["wall_s"] / on["wall_s"], 2)
    print(f"  prefix cache, group of {GROUP} x {len(ids):,} tokens: {off['prefill_tokens_computed']:,} prefill tokens "
          f"off vs {on['prefill_tokens_computed']:,} on ({out['prefill_tokens_ratio_off_vs_on']}x fewer), "
          f"{off['wall_s']:.2f} s vs {on['wall_s']:.2f} s", flush=True)
    return out


def sample_batch(url: str, tokenizer: Any, *, tasks: int, group: int, new_tokens: int, path: Path) -> dict:
    """One GRPO step's rollouts from the engine: `group` samples of each of the first `tasks` prompts
    of bench/trainer.py (chat template), temperature 1, `new_tokens` each, with the engine's logprobs;
    bench/trainer.py's reward, group advantages. Written to `path` as JSON Samples (trainer/data.py)."""
    import torch

    from openforge.engine.client import EngineClient
    from openforge.trainer.grpo import group_advantages

    prompts = [list(tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                  tokenize=True, return_dict=False)) for p in PROMPTS[:tasks]]

    async def sample() -> list:
        async with EngineClient(url, timeout=600) as client:
            return await asyncio.gather(*[
                client.generate(p, {"temperature": 1.0, "max_new_tokens": new_tokens, "ignore_eos": True,
                                    "sampling_seed": i * group + j})
                for i, p in enumerate(prompts) for j in range(group)])

    start = time.perf_counter()
    outs = asyncio.run(sample())
    wall = time.perf_counter() - start
    samples = []
    for i, prompt in enumerate(prompts):
        mine = outs[i * group:(i + 1) * group]
        rewards = [_reward(o.output_ids) for o in mine]
        advantages = group_advantages(torch.tensor(rewards)).tolist()
        for j, (o, r, a) in enumerate(zip(mine, rewards, advantages)):
            samples.append({"rollout_id": f"t{i}-{j}", "task_id": f"t{i}", "segment": 0, "token_ids": prompt + o.output_ids,
                            "loss_mask": [0] * len(prompt) + [1] * len(o.output_ids),
                            "logprobs": [0.0] * len(prompt) + o.logprobs, "advantage": a, "reward": r})
    path.write_text(json.dumps(samples))
    tokens = sum(len(o.output_ids) for o in outs)
    return {"rollouts": len(samples), "sampled_tokens": tokens, "wall_s": round(wall, 3),
            "engine_tokens_per_s": round(tokens / wall, 1)}


def lora_hot_load(url: str, adapter: Path, *, loads: int = 4) -> dict:
    """Milliseconds to hot-load the trained adapter into the serving engine, as the trainer does after
    each step (trainer/adapter_sync.py AdapterSync: load the new name, unload beyond the 2 kept), and the
    first request on it."""
    from openforge.engine.client import EngineClient
    from openforge.trainer.adapter_sync import AdapterSync
    from openforge.trainer.bridge import BackgroundLoop

    async def make_client() -> EngineClient:  # on the bridge's loop, which owns its connection pool
        return EngineClient(url, timeout=300)

    bridge = BackgroundLoop()
    client = bridge.run(make_client())
    try:
        sync = AdapterSync(client, bridge)
        times = []
        for i in range(loads):
            start = time.perf_counter()
            sync.load(f"step-{i}", str(adapter))
            times.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        out = bridge.run(client.generate([1, 2, 3], {"max_new_tokens": 1, "temperature": 0}, lora_path=f"step-{loads - 1}"))
        first_ms = (time.perf_counter() - start) * 1000
        bridge.run(client.aclose())
    finally:
        bridge.close()
    row = {"loads": loads, "median_ms": round(statistics.median(times[1:] or times), 1), "max_ms": round(max(times), 1),
           "first_ms": round(times[0], 1), "first_request_ms": round(first_ms, 1), "first_request_tokens": len(out.output_ids)}
    print(f"  LoRA hot-load: median {row['median_ms']} ms, first {row['first_ms']} ms", flush=True)
    return row
