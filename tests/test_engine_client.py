"""EngineClient against the scripted engine over real loopback HTTP: shapes, streaming, faults."""

from __future__ import annotations

import socket

import pytest

from engine.client import EngineClient, _DeltaTracker
from engine.scripted import ScriptedEngine, scripted_logprob
from engine.serve import serve_in_thread
from openforge.errors import EngineError

TOOL_CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'


@pytest.fixture
def scripted(tiny_model):
    engine = ScriptedEngine(tiny_model, [TOOL_CALL, "All done.", "third one", "fourth one"])
    with serve_in_thread(engine.app) as server:
        yield engine, server.url


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_generate_returns_scripted_tokens_and_logprobs(scripted):
    engine, url = scripted
    async with EngineClient(url) as client:
        out = await client.generate([5, 6, 7], {"max_new_tokens": 64, "temperature": 1.0}, rid="r1")
    expected = engine.completion_ids(TOOL_CALL)
    assert out.output_ids == expected
    assert out.output_ids[-1] == engine.eos_id
    assert out.logprobs == [scripted_logprob(t, i) for i, t in enumerate(expected)]
    assert (out.finish_reason, out.matched_stop) == ("stop", engine.eos_id)
    assert (out.prompt_tokens, out.completion_tokens) == (3, len(expected))
    assert out.text == TOOL_CALL
    assert engine.requests[0]["input_ids"] == [5, 6, 7] and engine.requests[0]["rid"] == "r1"
    assert engine.requests[0]["return_logprob"] is True


@pytest.mark.parametrize("incremental", [False, True])
async def test_stream_yields_incremental_deltas(tiny_model, incremental):
    engine = ScriptedEngine(tiny_model, [TOOL_CALL, TOOL_CALL], incremental_stream=incremental)
    with serve_in_thread(engine.app) as server:
        async with EngineClient(server.url) as client:
            whole = await client.generate([1, 2], {"max_new_tokens": 64})
            deltas = [d async for d in client.stream_generate([1, 2], {"max_new_tokens": 64})]
    assert all(len(d.token_ids) == 1 for d in deltas)
    assert [t for d in deltas for t in d.token_ids] == whole.output_ids
    assert [lp for d in deltas for lp in d.logprobs] == whole.logprobs
    assert [d.finish_reason for d in deltas] == [None] * (len(deltas) - 1) + ["stop"]


async def test_max_new_tokens_and_stop_strings(scripted):
    engine, url = scripted
    async with EngineClient(url) as client:
        cut = await client.generate([1], {"max_new_tokens": 2})
        stopped = await client.generate([1], {"max_new_tokens": 64, "stop": [" done"]})
    assert cut.finish_reason == "length" and len(cut.output_ids) == 2
    assert cut.output_ids == engine.completion_ids(TOOL_CALL)[:2]
    assert (stopped.finish_reason, stopped.matched_stop, stopped.text) == ("stop", " done", "All")


async def test_engine_down_is_one_clear_error():
    url = f"http://127.0.0.1:{_free_port()}"
    async with EngineClient(url, retries=1) as client:
        with pytest.raises(EngineError, match=f"engine at {url} is down .*after 2 tries"):
            await client.generate([1], {})
        assert await client.health() is False
        with pytest.raises(EngineError, match="did not become healthy within 0.2s"):
            await client.wait_healthy(0.2)


async def test_http_500_and_bad_request_carry_status_and_body(scripted):
    engine, url = scripted
    engine.fail_next("http_500")
    async with EngineClient(url) as client:
        with pytest.raises(EngineError, match="HTTP 500: scripted fault: internal error"):
            await client.generate([1], {})
        with pytest.raises(EngineError, match="HTTP 400: top_p must be in"):
            await client.generate([1], {"top_p": 0})
        with pytest.raises(EngineError, match="HTTP 400: input_ids must be a non-empty list"):
            await client.generate([], {})


async def test_dropped_stream_and_timeout_are_engine_errors(scripted):
    engine, url = scripted
    engine.fail_next("disconnect", after_tokens=3)
    engine.fail_next("disconnect")
    engine.fail_next("delay", seconds=1.0)
    async with EngineClient(url, timeout=0.3) as client:
        got = []
        with pytest.raises(EngineError, match="stream broke"):
            async for d in client.stream_generate([1], {"max_new_tokens": 64}):
                got.extend(d.token_ids)
        assert got == engine.completion_ids(TOOL_CALL)[:3]
        with pytest.raises(EngineError, match=f"engine at {url}"):
            await client.generate([1], {})
        with pytest.raises(EngineError, match="did not answer /generate within 0.3s"):
            await client.generate([1], {})


async def test_lora_admin_calls(scripted):
    engine, url = scripted
    async with EngineClient(url) as client:
        out = await client.load_lora_adapter("step-1", "/tmp/adapter-1")
        assert out["loaded_adapters"] == {"step-1": "/tmp/adapter-1"}
        await client.generate([1], {}, lora_path="step-1")
        assert engine.requests[-1]["lora_path"] == "step-1"
        await client.unload_lora_adapter("step-1")
        with pytest.raises(EngineError, match="'step-1' is not loaded"):
            await client.unload_lora_adapter("step-1")
        with pytest.raises(EngineError, match="'step-1' is not loaded"):
            await client.generate([1], {}, lora_path="step-1")
        await client.flush_cache()
        await client.update_weights_from_disk("/ckpt/step-2")
        assert engine.weight_paths == ["/ckpt/step-2"]


def test_delta_tracker_reads_cumulative_incremental_and_abort_chunks():
    def chunk(ids, lps, total, finish=None):
        return {"output_ids": ids, "meta_info": {"completion_tokens": total, "finish_reason": finish,
                                                 "output_token_logprobs": [[lp, t, None] for lp, t in zip(lps, ids)]}}
    cumulative = _DeltaTracker()
    assert cumulative.delta(chunk([4, 5], [-1, -2], 2)).token_ids == [4, 5]
    d = cumulative.delta(chunk([4, 5, 6], [-1, -2, -3], 3, {"type": "length", "length": 3}))
    assert (d.token_ids, d.logprobs, d.finish_reason) == ([6], [-3.0], "length")
    incremental = _DeltaTracker()
    incremental.delta(chunk([4, 5], [-1, -2], 2))
    assert incremental.delta(chunk([6], [-3], 3)).logprobs == [-3.0]
    # SGLang's abort chunk repeats only the last token while completion_tokens counts them all.
    aborted = incremental.delta(chunk([6], [-3], 3, {"type": "abort", "message": "x"}))
    assert (aborted.token_ids, aborted.finish_reason) == ([], "abort")
