"""Inputs of docs/cluster.md's capacity estimate: the proxy and the store at the highest concurrency
this machine takes, measured the way bench/proxy.py and bench/recording.py do.

    proxy    forge's proxy (chat API: auth, template + tokenising, tool parsing, both recorded rows) in
             front of an instant fake engine, one process; C concurrent rollouts (each its own key,
             one call at a time) for C in 32 to 2048: req/s, server CPU ms per call, p50 latency;
             against the same clients straight to the fake engine (the floor), in the same run.
    store    calls/s recorded through AsyncStore.insert_calls (batches of 64, 8 producers) with a
             Claude Code-sized call (a 30,000-token prompt, 500 sampled tokens with logprobs), and the
             database bytes each call adds.

The machine is a shared 2-core VM: the proxy and its load generator share the same cores, so the
req/s are a floor for a dedicated core, and the CPU ms per call is the figure to extrapolate with.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.proxy import ANSWER, MESSAGES, TOOLS, _forge, _Server, _throughput
from bench.recording import _measure, _rows

CONCURRENCY = (32, 256, 512, 1024, 2048)


def _proxy(quick: bool) -> dict:
    from openforge.engine.tiny import build_tokenizer
    from openforge.store import Store

    levels = CONCURRENCY[:2] if quick else CONCURRENCY
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        tok = build_tokenizer()
        tok.save_pretrained(tmp / "tok")
        output_ids = tok.encode(ANSWER, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
        store = Store(tmp / "forge.db")
        run_id = store.create_run(kind="bench").id
        me = [sys.executable, "-m", "bench.proxy", "serve"]
        engine = _Server([*me, "engine", json.dumps({"output_ids": output_ids})])
        forge = _forge(Path(__file__).resolve().parent.parent, store.path, engine.url, tmp / "tok")
        try:
            chat = {"model": "m", "messages": MESSAGES, "tools": TOOLS}
            prompt = tok.encode(tok.apply_chat_template(MESSAGES, tools=TOOLS, tokenize=False,
                                                        add_generation_prompt=True), add_special_tokens=False)
            gen = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 64}, "return_logprob": True}
            for c in levels:
                keys = [{"authorization": f"Bearer {store.create_rollout(run_id=run_id, task_id='t', status='running').key}"}
                        for _ in range(c)]
                n = max(3 * c, 600 if quick else 1500)
                refused = [0]  # 429s past the proxy's queue (5 x max_concurrent_calls), retried as harnesses do
                try:
                    rps, cpu_ms, p50 = asyncio.run(_throughput(forge.url, "/v1/chat/completions", chat, n, keys, forge,
                                                               refused))
                except Exception as exc:  # noqa: BLE001 - what broke at this concurrency is the result
                    out[f"c{c}"] = {"error": f"{type(exc).__name__}: {exc}", "calls": n}
                    print(f"  proxy c={c:5d}: {type(exc).__name__}: {exc}", flush=True)
                    continue
                d_rps, d_cpu, d_p50 = asyncio.run(_throughput(engine.url, "/generate", gen, n, [{}] * c, engine))
                out[f"c{c}"] = {"forge_rps": round(rps, 1), "forge_cpu_ms_per_call": round(cpu_ms, 2),
                                "forge_p50_ms": round(p50, 1), "direct_rps": round(d_rps, 1),
                                "direct_p50_ms": round(d_p50, 1), "calls": n, "refused_429": refused[0]}
                print(f"  proxy c={c:5d}: {rps:7.1f} req/s, {cpu_ms:6.2f} ms CPU/call, p50 {p50:7.1f} ms "
                      f"(engine alone: {d_rps:7.1f} req/s, p50 {d_p50:6.1f} ms), {refused[0]} refused with 429 and retried",
                      flush=True)
        finally:
            forge.close()
            engine.close()
    return out


def _store(quick: bool) -> dict:
    from openforge.store import Store

    n = 200 if quick else 600
    prompt_len, completion_len = 30_000, 500
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "forge.db"
        store = Store(path)
        run = store.create_run(kind="bench")
        ro = store.create_rollout(run_id=run.id, task_id="t")
        store.close()
        rows = _rows(run.id, ro.id, n, prompt_len, completion_len)
        before = sum(f.stat().st_size for f in Path(tmp).iterdir())
        t = time.perf_counter()
        rate = asyncio.run(_measure(path, rows, 64, producers=8))
        wall = time.perf_counter() - t
        size = sum(f.stat().st_size for f in Path(tmp).iterdir()) - before
    out = {"calls_per_s": round(rate, 1), "bytes_per_call": int(size / n), "prompt_tokens": prompt_len,
           "completion_tokens": completion_len, "calls": n, "wall_s": round(wall, 2)}
    print(f"  store: {rate:.1f} calls/s of {prompt_len}-token prompts, {size / n / 1e3:.0f} kB a call", flush=True)
    return out


def run(quick: bool = False) -> dict:
    res = {"proxy": _proxy(quick), "store": _store(quick), "cpus": os.cpu_count(),
           "load_avg_1m": round(os.getloadavg()[0], 1)}
    print(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    run(quick="--quick" in sys.argv)
