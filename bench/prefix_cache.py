"""The embedded engine's prefix cache on a real harness prompt: a GRPO group of 8 rollouts, cache on vs off.

The prompt is Claude Code's recorded first request (docs/harness-captures/claude-code.jsonl: its
system prompt, 24 tools and first user turn), rendered with the tiny model's tokenizer and chat
template: 15,807 tokens (a live Claude Code session with more tools and a longer CLAUDE.md sends
more, ~48.5k in docs/harness-captures' notes). Measured, same run, same model (the default tiny
model, 131,072 positions), one torch thread:

- prefill tokens/s of one request of 8k, 32k and 50k tokens (the recorded prompt repeated), cache off
- a group of 8 concurrent /generate requests on the recorded prompt (quick: its first 4,096
  tokens), 8 new tokens each, cache on vs off: prefill tokens computed (the engine's own counter),
  wall time of the group, median per-rollout latency, ratios
- then each rollout's second turn (its prompt + answer + 200 tokens of tool result), cache on:
  time, prefill tokens computed, the median fraction of each prompt served from the cache
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from openforge.engine.embedded import EmbeddedEngine
from openforge.engine.serve import serve_in_thread
from openforge.engine.tiny import build_tiny_model
from openforge.config import EmbeddedEngineConfig

CAPTURE = Path(__file__).resolve().parent.parent / "docs" / "harness-captures" / "claude-code.jsonl"
GROUP = 8


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") if isinstance(b, dict) else str(b) for b in content or [])


def claude_code_prompt(tokenizer) -> list[int]:
    """Claude Code's first /v1/messages request, rendered as the proxy renders it for a ChatML model."""
    body = next(r["body"] for r in map(json.loads, CAPTURE.open()) if r["method"] == "POST")
    messages = [{"role": "system", "content": _text(body.get("system"))}]
    messages += [{"role": m["role"], "content": _text(m["content"])} for m in body["messages"]]
    tools = [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                               "parameters": t.get("input_schema", {})}} for t in body.get("tools", [])]
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    return list(tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids)


def _post(http: httpx.Client, ids: list[int], new_tokens: int, seed: int) -> dict:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 1.0,
                                                  "ignore_eos": True, "sampling_seed": seed}}
    return http.post("/generate", json=body).raise_for_status().json()


def _prefill_rate(url: str, ids: list[int]) -> float:
    with httpx.Client(base_url=url, timeout=600) as http:
        start = time.perf_counter()
        _post(http, ids, 1, 0)
        return len(ids) / (time.perf_counter() - start)


async def _group(url: str, ids: list[int]) -> tuple[float, list[float], list[dict]]:
    async def one(http: httpx.AsyncClient, seed: int) -> tuple[float, dict]:
        t = time.perf_counter()
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 8, "temperature": 1.0, "ignore_eos": True,
                                                      "sampling_seed": seed}}
        out = (await http.post("/generate", json=body)).raise_for_status().json()
        return time.perf_counter() - t, out

    async with httpx.AsyncClient(base_url=url, timeout=900) as http:
        start = time.perf_counter()
        done = await asyncio.gather(*[one(http, seed) for seed in range(GROUP)])
        return time.perf_counter() - start, [d[0] for d in done], [d[1] for d in done]


def _computed(engine: EmbeddedEngine) -> int:
    return engine.scheduler.stats()["prefill_tokens_computed"]


def run(quick: bool = False) -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # what `forge engine` picks for a model this small
    try:
        return _run(quick)
    finally:
        torch.set_num_threads(threads)


def _run(quick: bool) -> dict:
    results: dict = {"group": GROUP, "torch_threads": 1}
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_model(Path(tmp) / "tiny")
        engines = {side: EmbeddedEngine(EmbeddedEngineConfig(model=str(path), prefix_cache_mb=mb, max_batch_size=GROUP))
                   for side, mb in (("on", 512), ("off", 0))}
        prompt = claude_code_prompt(engines["on"].m.tokenizer)
        results["claude_code_prompt_tokens"] = len(prompt)
        print(f"Claude Code's first request: {len(prompt):,} tokens with the tiny tokenizer", flush=True)
        with serve_in_thread(engines["on"].app) as on, serve_in_thread(engines["off"].app) as off:
            urls = {"on": on.url, "off": off.url}
            _prefill_rate(off.url, prompt[:256])  # warm up
            for n in ([2048, 8192] if quick else [8192, 32768, 50000]):
                rate = _prefill_rate(off.url, (prompt * (n // len(prompt) + 1))[:n])
                results[f"prefill_tokens_per_s_{n}"] = rate
                print(f"prefill of {n:,} tokens: {rate:,.0f} tokens/s ({n / rate:.1f} s)", flush=True)
            ids = prompt[:4096] if quick else prompt
            results["group_tokens"] = len(ids)
            for side in ("off", "on"):
                before = _computed(engines[side])
                wall, latencies, outs = asyncio.run(_group(urls[side], ids))
                row = {"wall_s": wall, "median_rollout_s": statistics.median(latencies),
                       "prefill_tokens_computed": _computed(engines[side]) - before,
                       "cached_tokens": sum(o["meta_info"]["cached_tokens"] for o in outs)}
                results[f"cache_{side}"] = row
                print(f"group of {GROUP} x {len(ids):,} tokens, cache {side}: {wall:.1f} s wall, median rollout "
                      f"{row['median_rollout_s']:.1f} s, {row['prefill_tokens_computed']:,} prefill tokens computed",
                      flush=True)
            on_row, off_row = results["cache_on"], results["cache_off"]
            results["prefill_tokens_ratio_off_vs_on"] = off_row["prefill_tokens_computed"] / on_row["prefill_tokens_computed"]
            results["wall_ratio_off_vs_on"] = off_row["wall_s"] / on_row["wall_s"]
            results["median_rollout_ratio_off_vs_on"] = off_row["median_rollout_s"] / on_row["median_rollout_s"]
            results["turn_2"] = _second_turn(urls["on"], engines["on"], ids, outs, prompt)
        for engine in engines.values():
            engine.close()
    print(f"cache on vs off: {results['prefill_tokens_ratio_off_vs_on']:.1f}x fewer prefill tokens, "
          f"{results['wall_ratio_off_vs_on']:.1f}x faster group, median rollout "
          f"{results['median_rollout_ratio_off_vs_on']:.1f}x faster", flush=True)
    return results


def _second_turn(url: str, engine: EmbeddedEngine, ids: list[int], outs: list[dict], prompt: list[int]) -> dict:
    """Each rollout's next call: its prompt, its answer, then ~200 tokens of tool result."""
    tool_result = prompt[-200:]
    before = _computed(engine)
    cached = []
    with httpx.Client(base_url=url, timeout=600) as http:
        start = time.perf_counter()
        for seed, out in enumerate(outs):
            turn = ids + out["output_ids"] + tool_result
            cached.append(_post(http, turn, 8, seed)["meta_info"]["cached_tokens"] / len(turn))
        wall = time.perf_counter() - start
    row = {"wall_s": wall, "prefill_tokens_computed": _computed(engine) - before,
           "median_cached_fraction": statistics.median(cached)}
    print(f"second turns (8, one after another): {wall:.1f} s, {row['prefill_tokens_computed']:,} prefill tokens "
          f"computed, median {row['median_cached_fraction']:.1%} of each prompt from the cache", flush=True)
    return row
