"""engine.kind = "router": what the route through SGLang's router and forge's front costs per call.

Two embedded engines (random Qwen2 64-wide, the tiny model) behind the real sglang-router, started as
forge starts them (engine/router.py). Sequential /generate calls of one rollout (a 64-token prompt,
1 new token, so the engine's own time is small) sent three ways, interleaved call by call:

    worker   straight to the worker that holds the rollout   (the floor)
    router   to sglang-router with X-SMG-Routing-Key          (the router's hop)
    front    to forge's front (what the proxy calls)          (front + router)

p50/p99 ms per call, and each hop's added p50. Needs the [router] extra.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.timing import percentile


def run(quick: bool = False) -> dict:
    from openforge.engine.supervisor import EngineProcess
    from openforge.engine.tiny import build_tiny_model
    from openforge.config import RouterEngineConfig

    n = 40 if quick else 150
    key = "bench-key"
    auth = {"Authorization": f"Bearer {key}"}
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "tiny")
        cfg = RouterEngineConfig(model=str(model), workers=2, prefix_cache_mb=64, startup_timeout_s=300)
        engine = EngineProcess(cfg, log_path=Path(tmp) / "engine.log", api_key=key)
        engine.start()
        try:
            info = httpx.get(f"{engine.url}/router_workers", headers=auth).json()
            body = {"input_ids": list(range(3, 67)), "sampling_params": {"max_new_tokens": 1}, "rid": "bench_00"}
            with httpx.Client(timeout=60) as http:
                http.post(f"{engine.url}/generate", json=body, headers=auth).raise_for_status()  # pins the rollout
                worker = next(w["url"] for w in info["workers"]
                              if http.get(f"{w['url']}/get_server_info", headers=auth).json()
                              ["internal_states"][0]["cached_tokens"] + http.get(f"{w['url']}/get_server_info",
                              headers=auth).json()["internal_states"][0]["prefill_tokens_computed"] > 0)
                ways = {"worker": (worker, auth), "router": (info["router"], {**auth, "X-SMG-Routing-Key": "bench"}),
                        "front": (engine.url, auth)}
                times: dict[str, list[float]] = {k: [] for k in ways}
                for _ in range(n):
                    for name, (url, hdr) in ways.items():
                        t = time.perf_counter()
                        http.post(f"{url}/generate", json=body, headers=hdr).raise_for_status()
                        times[name].append((time.perf_counter() - t) * 1000)
        finally:
            engine.stop()
    res = {k: {"p50_ms": round(statistics.median(v), 2), "p99_ms": round(percentile(v, 0.99), 2)} for k, v in times.items()}
    res["router_added_p50_ms"] = round(res["router"]["p50_ms"] - res["worker"]["p50_ms"], 2)
    res["front_added_p50_ms"] = round(res["front"]["p50_ms"] - res["router"]["p50_ms"], 2)
    res["ratio_front_vs_worker"] = round(res["front"]["p50_ms"] / res["worker"]["p50_ms"], 2)
    res["calls"] = n
    print(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    run(quick="--quick" in sys.argv)
