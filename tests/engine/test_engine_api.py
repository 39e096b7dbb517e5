"""The engine-client suite: SGLang's native API through EngineClient, against any engine.

By default it runs against the embedded engine (a peaky tiny model, on loopback). With
ENGINE_URL=http://host:port it runs the same checks against that engine instead, e.g. a real SGLang
server on a GPU machine (bench/gpu_smoke.sh does this); ENGINE_MODEL_PATH (the served checkpoint's
local folder) enables the LoRA check there, ENGINE_API_KEY the engine's key (SGLang's --api-key).
Only model-agnostic facts are asserted.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from openforge.engine.client import EngineClient
from openforge.errors import EngineError

PROMPTS = [[11, 12, 13, 14, 15], [21, 22, 23], [31, 32, 33, 34, 35, 36, 37], [41], [51, 52], [61, 62, 63, 64]]
GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
KEY = os.environ.get("ENGINE_API_KEY") or None


@pytest.fixture(scope="module")
def engine(tmp_path_factory, tiny_model):
    """(base URL, local folder of the served model or None)."""
    if os.environ.get("ENGINE_URL"):
        yield os.environ["ENGINE_URL"], os.environ.get("ENGINE_MODEL_PATH") or None
        return
    from openforge.engine.embedded import EmbeddedEngine
    from openforge.engine.serve import serve_in_thread
    from openforge.engine.testing import make_peaky_model
    from openforge.config import EmbeddedEngineConfig

    model = make_peaky_model(tiny_model, tmp_path_factory.mktemp("api") / "peaky")
    engine = EmbeddedEngine(EmbeddedEngineConfig(model=str(model), max_batch_size=4))
    with serve_in_thread(engine.app) as server:
        yield server.url, str(model)
    engine.close()


@pytest.fixture
async def client(engine):
    async with EngineClient(engine[0], timeout=120, api_key=KEY) as c:
        yield c


async def test_health_and_model_info(client):
    assert await client.health() is True
    await client.wait_healthy(5)
    info = await client.model_info()
    assert info["model_path"] and info["is_generation"] is True


async def test_greedy_is_deterministic_and_stops_at_max_new_tokens(client):
    a = await client.generate(PROMPTS[0], GREEDY)
    b = await client.generate(PROMPTS[0], GREEDY)
    assert a.output_ids == b.output_ids and len(a.output_ids) == 8
    assert (a.finish_reason, a.prompt_tokens, a.completion_tokens) == ("length", 5, 8)
    assert len(a.logprobs) == 8 and all(lp <= 0 for lp in a.logprobs)
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


async def test_stream_deltas_add_up_to_the_non_streamed_answer(client):
    whole = await client.generate(PROMPTS[2], GREEDY)
    deltas = [d async for d in client.stream_generate(PROMPTS[2], GREEDY)]
    assert [t for d in deltas for t in d.token_ids] == whole.output_ids
    assert [lp for d in deltas for lp in d.logprobs] == pytest.approx(whole.logprobs, abs=1e-4)
    assert deltas[-1].finish_reason == "length" and all(d.finish_reason is None for d in deltas[:-1])


async def test_stop_token_ids_end_the_completion_on_that_token(client):
    free = await client.generate(PROMPTS[1], GREEDY)
    stop = free.output_ids[3]
    first = free.output_ids.index(stop)
    # Without ignore_eos an eos token may end it earlier, so the answer is a prefix of `free` that
    # ends either on an eos or exactly on the first `stop`.
    out = await client.generate(PROMPTS[1], {**GREEDY, "ignore_eos": False, "stop_token_ids": [stop]})
    assert out.finish_reason == "stop" and out.output_ids == free.output_ids[: len(out.output_ids)]
    assert len(out.output_ids) <= first + 1
    assert (out.matched_stop == stop) == (len(out.output_ids) == first + 1)


async def test_ignore_eos_ignores_stop_token_ids_too(client):
    """SGLang's Req.check_finished skips every stop token under ignore_eos; stop strings still count."""
    free = await client.generate(PROMPTS[1], GREEDY)
    out = await client.generate(PROMPTS[1], {**GREEDY, "stop_token_ids": [free.output_ids[0]]})
    assert out.output_ids == free.output_ids and out.finish_reason == "length"


async def test_seeded_sampling_is_reproducible(client):
    params = {"temperature": 1.0, "max_new_tokens": 12, "ignore_eos": True}
    runs = [await client.generate(PROMPTS[3], {**params, "sampling_seed": seed}) for seed in (5, 5, 6, 7)]
    assert runs[0].output_ids == runs[1].output_ids
    assert len({tuple(r.output_ids) for r in runs}) >= 2


async def test_concurrent_requests_all_complete(client):
    outs = await asyncio.gather(*[client.generate(p, GREEDY) for p in PROMPTS])
    assert [len(o.output_ids) for o in outs] == [8] * len(PROMPTS)
    assert [o.prompt_tokens for o in outs] == [len(p) for p in PROMPTS]


async def test_bad_requests_are_engine_errors(client):
    with pytest.raises(EngineError, match="HTTP 400"):
        await client.generate(PROMPTS[0], {"top_p": 0.0})
    with pytest.raises(EngineError, match="HTTP 400"):
        await client.generate(PROMPTS[0], {"max_new_tokens": 4}, lora_path="no-such-adapter")
    with pytest.raises(EngineError, match="load_lora_adapter") as refused:
        await client.load_lora_adapter("ghost", "/nonexistent/adapter")
    assert "loaded_adapters" not in str(refused.value)  # SGLang's error_message, not the whole body


async def test_runtime_lora_changes_greedy_output_and_unloading_restores_it(client, engine, tmp_path):
    if engine[1] is None:
        pytest.skip("set ENGINE_MODEL_PATH to the served checkpoint's folder to build an adapter for it")
    from openforge.engine.testing import make_random_lora

    adapter = make_random_lora(engine[1], tmp_path / "smoke-lora", target_modules=("q_proj", "v_proj"))
    base = await client.generate(PROMPTS[0], GREEDY)
    await client.load_lora_adapter("smoke-a", str(adapter))
    try:
        tuned = await client.generate(PROMPTS[0], GREEDY, lora_path="smoke-a")
        untouched = await client.generate(PROMPTS[0], GREEDY)
    finally:
        await client.unload_lora_adapter("smoke-a")
    assert tuned.output_ids != base.output_ids
    assert untouched.output_ids == base.output_ids
    assert (await client.generate(PROMPTS[0], GREEDY)).output_ids == base.output_ids
    with pytest.raises(EngineError):
        await client.generate(PROMPTS[0], GREEDY, lora_path="smoke-a")


async def test_raw_stream_chunks_count_every_token(engine):
    """The wire format itself: SSE `data:` chunks, completion_tokens cumulative, `[DONE]` last."""
    import json

    import httpx

    body = {"input_ids": PROMPTS[4], "sampling_params": GREEDY, "return_logprob": True, "stream": True}
    headers = {"Authorization": f"Bearer {KEY}"} if KEY else {}
    async with httpx.AsyncClient(base_url=engine[0], timeout=120, headers=headers) as http:
        async with http.stream("POST", "/generate", json=body) as resp:
            assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
            lines = [line async for line in resp.aiter_lines() if line.startswith("data:")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[5:]) for line in lines[:-1]]
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 8
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
