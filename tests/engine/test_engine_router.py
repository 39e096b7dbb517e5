"""engine.kind = "router": the real sglang-router (PyPI, Rust) in front of two embedded engines, started
by the engine supervisor as one engine URL. Calls spread over both workers, a rollout's calls stay on
one, an adapter hot-load reaches both, and a SIGKILLed worker leaves every rollout served."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("sglang_router", reason="the [router] extra (sglang-router) is not installed")

from openforge.engine.client import EngineClient  # noqa: E402
from openforge.engine.supervisor import EngineProcess  # noqa: E402
from openforge.config import RouterEngineConfig  # noqa: E402

KEY = "router-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def _prefill(url: str) -> int:
    """Prompt tokens this worker has seen (computed or from its prefix cache)."""
    s = httpx.get(f"{url}/get_server_info", headers=AUTH, timeout=30).json()["internal_states"][0]
    return s["prefill_tokens_computed"] + s["cached_tokens"]


def _wait(predicate, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


@pytest.fixture
def fleet(tiny_model: Path, tmp_path: Path):
    cfg = RouterEngineConfig(model=str(tiny_model), workers=2, prefix_cache_mb=64, startup_timeout_s=240)
    engine = EngineProcess(cfg, log_path=tmp_path / "engine.log", api_key=KEY)
    engine.start()
    try:
        yield engine
    finally:
        engine.stop()


async def _rollout_turns(client: EngineClient, rollout: str, turns: int, urls: list[str]) -> list[int]:
    """Run `turns` growing calls of one rollout (rid and routing key as the proxy sends them); the worker
    of each."""
    rng = random.Random(rollout)
    ids = [rng.randrange(3, 200) for _ in range(30)]
    where = []
    for turn in range(turns):
        before = [_prefill(u) for u in urls]
        out = await client.generate(ids, {"max_new_tokens": 2}, rid=f"{rollout}_{turn:024x}", routing_key=rollout)
        grew = [a - b for a, b in zip((_prefill(u) for u in urls), before)]
        assert sorted(grew)[0] == 0 and max(grew) == len(ids)  # exactly one worker saw this prompt
        where.append(grew.index(max(grew)))
        ids = ids + out.output_ids + [rng.randrange(3, 200) for _ in range(5)]  # the next turn extends it
    return where


@pytest.mark.slow
def test_router_spreads_rollouts_keeps_each_on_one_worker_and_survives_a_dead_worker(fleet: EngineProcess,
                                                                                     tiny_model: Path) -> None:
    info = httpx.get(f"{fleet.url}/router_workers", headers=AUTH).json()
    urls = [w["url"] for w in info["workers"]]
    assert len(urls) == 2 and info["policy"] == "manual"
    assert httpx.get(f"{fleet.url}/model_info").status_code == 401  # the engine key, as a single engine

    async def scenario() -> None:
        client = EngineClient(fleet.url, timeout=120, api_key=KEY)
        try:
            # the manual policy gives a new routing key a random worker: place rollouts until both
            # workers hold some (6 may all land on one, 1 run in 32; 20 all on one is 1 in 500,000)
            placed: dict[str, list[int]] = {}
            while len(placed) < 6 or ({w[0] for w in placed.values()} != {0, 1} and len(placed) < 20):
                key = f"r{len(placed)}"
                placed[key] = await _rollout_turns(client, key, 3, urls)
            assert all(len(set(w)) == 1 for w in placed.values()), placed  # a rollout's turns on one worker
            assert {w[0] for w in placed.values()} == {0, 1}, placed  # rollouts spread over both

            adapter = tiny_model.parent / "router-adapter"
            if not adapter.exists():
                from openforge.config import TrainerConfig
                from openforge.trainer.model import build_policy
                import torch

                build_policy(tiny_model, TrainerConfig(lora_r=4, lora_alpha=8), device=torch.device("cpu")) \
                    .save_pretrained(adapter)
            await client.load_lora_adapter("a1", str(adapter))
            for u in urls:
                assert "a1" in httpx.get(f"{u}/get_model_info", headers=AUTH).json()["loaded_adapters"]

            # SIGKILL the worker that holds r0: every rollout is still served, r0 moved to the other
            dead = placed["r0"][0]
            os.kill(info["workers"][dead]["pid"], signal.SIGKILL)
            for key in placed:
                out = await client.generate([5, 6, 7, 8], {"max_new_tokens": 2}, lora_path="a1", rid=f"{key}_{'f' * 24}",
                                            routing_key=key)
                assert len(out.output_ids) == 2
        finally:
            await client.aclose()

    asyncio.run(scenario())

    # the supervisor brings the dead worker back on its port, and it is given the adapter again
    def all_serve_the_adapter() -> bool:
        try:
            return all("a1" in httpx.get(f"{u}/get_model_info", headers=AUTH, timeout=5).json()["loaded_adapters"]
                       for u in urls)
        except httpx.HTTPError:
            return False

    _wait(all_serve_the_adapter, "the restarted worker to serve the adapter again")

    # A cluster's router (engine.router_url): forge starts nothing but the front, with its own key,
    # finds the workers through the router and fans adapter loads out to them
    cfg = RouterEngineConfig(model=str(tiny_model), router_url=info["router"], startup_timeout_s=120)
    os.environ["FORGE_WORKER_API_KEY"] = KEY
    try:
        front = EngineProcess(cfg, log_path=tiny_model.parent / "front.log", api_key="run-key")
        front.start()
    finally:
        del os.environ["FORGE_WORKER_API_KEY"]
    try:
        run_auth = {"Authorization": "Bearer run-key"}
        assert sorted(w["url"] for w in httpx.get(f"{front.url}/router_workers", headers=run_auth).json()["workers"]) \
            == sorted(urls)
        r = httpx.post(f"{front.url}/load_lora_adapter", headers=run_auth, timeout=60,
                       json={"lora_name": "a2", "lora_path": str(tiny_model.parent / "router-adapter")})
        assert r.status_code == 200, r.text
        assert all("a2" in httpx.get(f"{u}/get_model_info", headers=AUTH).json()["loaded_adapters"] for u in urls)
        r = httpx.post(f"{front.url}/generate", headers=run_auth, timeout=60,
                       json={"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2}, "lora_path": "a2",
                             "rid": "r9_00"})
        assert r.status_code == 200 and len(r.json()["output_ids"]) == 2
    finally:
        front.stop()


def test_the_front_hands_the_clients_routing_key_to_the_router(tmp_path: Path) -> None:
    """The real router routes by the header alone (it reads no body field): the front passes on the
    one EngineClient sent, and sends none when the client sent none. The router here is a stand-in on
    loopback that records what reaches it."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from openforge.engine.client import ROUTING_KEY_HEADER
    from openforge.engine.router import Fleet, create_front
    from openforge.engine.serve import serve_in_thread

    seen: list[str | None] = []

    async def generate(request: Request) -> JSONResponse:
        seen.append(request.headers.get(ROUTING_KEY_HEADER))
        return JSONResponse({"text": "", "output_ids": [3], "meta_info": {
            "finish_reason": {"type": "length"}, "prompt_tokens": 1, "completion_tokens": 1,
            "output_token_logprobs": [[-0.5, 3, None]]}})

    async def workers(request: Request) -> JSONResponse:
        return JSONResponse({"workers": [{"url": "http://127.0.0.1:9", "is_healthy": True}]})

    stand_in = Starlette(routes=[Route("/generate", generate, methods=["POST"]), Route("/workers", workers)])
    with serve_in_thread(stand_in) as router:
        fleet = Fleet(RouterEngineConfig(router_url=router.url, startup_timeout_s=10), api_key="",
                      log_dir=tmp_path)
        fleet.start()
        with serve_in_thread(create_front(fleet)) as front:
            async def calls() -> None:
                async with EngineClient(front.url, timeout=10) as client:
                    await client.generate([1, 2], {}, rid="r-7_00ff", routing_key="r-7")
                    await client.generate([1, 2], {}, rid="r-8_00ff")
            asyncio.run(calls())
    assert seen == ["r-7", None]
