"""The embedded engine's correctness against the model itself (issue 7's list), over real HTTP.

- returned logprobs == a fresh fp32 forward pass of the same tokens (max abs diff <= 1e-4)
- greedy output == `model.generate` greedy output
- a LoRA adapter loaded at run time changes outputs; unloading restores them exactly
- concurrent requests all complete and match their serial results under greedy decoding
"""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from openforge.engine.client import EngineClient
from openforge.engine.embedded import EmbeddedEngine
from openforge.engine.serve import serve_in_thread
from openforge.engine.testing import make_peaky_model, make_random_lora
from openforge.config import EmbeddedEngineConfig
from openforge.errors import EngineError

GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_model):
    root = tmp_path_factory.mktemp("embedded")
    peaky = make_peaky_model(tiny_model, root / "peaky")
    return {
        "peaky": peaky,
        "other": make_peaky_model(tiny_model, root / "other", seed=9),
        "lora": make_random_lora(peaky, root / "lora-a", seed=3),
        "lora_b": make_random_lora(peaky, root / "lora-b", seed=4),
    }


@pytest.fixture(scope="module")
def served(models):
    engine = EmbeddedEngine(EmbeddedEngineConfig(model=str(models["peaky"]), max_batch_size=4))
    with serve_in_thread(engine.app) as server:
        yield engine, server.url
    engine.close()


@pytest.fixture(scope="module")
def reference(models):
    """A separate copy of the model, never touched by the engine: the ground truth."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(models["peaky"]), dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(models["peaky"]))


def _prompt(tokenizer, text: str) -> list[int]:
    return list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                              tokenize=True, return_dict=False))


def _forward_logprobs(model, prompt: list[int], output: list[int], temperature: float = 1.0) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    lp = torch.log_softmax(logits / temperature, dim=-1)
    return [float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(output)]


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
async def test_logprobs_equal_a_fresh_forward_pass(served, reference, temperature):
    _, url = served
    model, tok = reference
    prompt = _prompt(tok, "count the lines in the file")
    params = {"temperature": temperature, "max_new_tokens": 24, "ignore_eos": True, "top_p": 0.9, "sampling_seed": 3}
    async with EngineClient(url) as client:
        out = await client.generate(prompt, params)
    assert len(out.output_ids) == 24
    # SGLang's definition: under log_softmax(logits / T) before top-p; greedy reports T = 1.
    ref = _forward_logprobs(model, prompt, out.output_ids, temperature or 1.0)
    assert max(abs(a - b) for a, b in zip(out.logprobs, ref)) <= 1e-4


async def test_greedy_equals_model_generate(served, reference):
    _, url = served
    model, tok = reference
    async with EngineClient(url) as client:
        for text in ("hello world", "write a file named data.txt"):
            prompt = _prompt(tok, text)
            out = await client.generate(prompt, {"temperature": 0, "max_new_tokens": 16})
            expected = model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)[0, len(prompt):]
            assert out.output_ids == expected.tolist()


async def test_concurrent_requests_match_their_serial_results(served, reference):
    engine, url = served
    _, tok = reference
    prompts = [_prompt(tok, t) for t in ("a", "run the tests please", "ls", "make sure the file contains the word",
                                         "echo hello", "sort uniq head tail")]
    seeded = {"temperature": 1.0, "max_new_tokens": 12, "ignore_eos": True, "sampling_seed": 11}
    async with EngineClient(url) as client:
        serial = [await client.generate(p, GREEDY) for p in prompts]
        serial_seeded = [await client.generate(p, seeded) for p in prompts]
        together = await asyncio.gather(*[client.generate(p, GREEDY) for p in prompts],
                                        *[client.generate(p, seeded) for p in prompts])
    n = len(prompts)
    assert [o.output_ids for o in together[:n]] == [o.output_ids for o in serial]
    assert [o.output_ids for o in together[n:]] == [o.output_ids for o in serial_seeded]
    for a, b in zip(together, serial + serial_seeded):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= 1e-4
    assert engine.scheduler.idle()


async def test_runtime_lora_changes_outputs_and_unloading_restores_them(served, models, reference):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    _, url = served
    _, tok = reference
    prompt = _prompt(tok, "write a file")
    async with EngineClient(url) as client:
        base = await client.generate(prompt, GREEDY)
        loaded = await client.load_lora_adapter("a", str(models["lora"]))
        assert loaded["loaded_adapters"] == {"a": str(models["lora"])}
        await client.load_lora_adapter("b", str(models["lora_b"]))
        # Base and two adapters decoded at once: each request gets its own adapter's tokens.
        with_a, with_b, base_again = await asyncio.gather(
            client.generate(prompt, GREEDY, lora_path="a"), client.generate(prompt, GREEDY, lora_path="b"),
            client.generate(prompt, GREEDY))
        await client.unload_lora_adapter("b")
        await client.unload_lora_adapter("a")
        restored = await client.generate(prompt, GREEDY)
        with pytest.raises(EngineError, match="'a' is not loaded"):
            await client.generate(prompt, GREEDY, lora_path="a")
    assert with_a.output_ids != base.output_ids and with_b.output_ids != with_a.output_ids
    assert base_again.output_ids == base.output_ids
    assert restored.output_ids == base.output_ids and restored.logprobs == base.logprobs
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(models["peaky"])), str(models["lora"]))
    ref = _forward_logprobs(peft.eval(), prompt, with_a.output_ids)
    assert max(abs(a - b) for a, b in zip(with_a.logprobs, ref)) <= 1e-4


async def test_update_weights_from_disk_swaps_the_model(served, models, reference):
    from transformers import AutoModelForCausalLM

    _, url = served
    _, tok = reference
    prompt = _prompt(tok, "hello")
    other = AutoModelForCausalLM.from_pretrained(str(models["other"])).eval()
    expected = other.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)[0, len(prompt):].tolist()
    async with EngineClient(url) as client:
        before = await client.generate(prompt, {"temperature": 0, "max_new_tokens": 12})
        await client.update_weights_from_disk(str(models["other"]))
        after = await client.generate(prompt, {"temperature": 0, "max_new_tokens": 12})
        assert (await client.model_info())["model_path"] == str(models["other"])
        await client.update_weights_from_disk(str(models["peaky"]))
        back = await client.generate(prompt, {"temperature": 0, "max_new_tokens": 12})
        with pytest.raises(EngineError, match="no config.json"):
            await client.update_weights_from_disk("/nonexistent")
    assert after.output_ids == expected != before.output_ids
    assert back.output_ids == before.output_ids


async def test_stop_strings_eos_and_an_abandoned_stream(served, reference):
    engine, url = served
    _, tok = reference
    prompt = _prompt(tok, "echo hello")
    async with EngineClient(url) as client:
        free = await client.generate(prompt, GREEDY)
        word = tok.decode(free.output_ids[4:6])
        stopped = await client.generate(prompt, {**GREEDY, "stop": [word]})
        ended = await client.generate(prompt, {**GREEDY, "ignore_eos": False, "stop_token_ids": [free.output_ids[0]]})
        async for _ in client.stream_generate(prompt, {**GREEDY, "max_new_tokens": 200}):
            break  # the client walks away after the first token
    assert stopped.finish_reason == "stop" and stopped.matched_stop == word
    assert word not in stopped.text and len(stopped.output_ids) <= 6
    assert ended.output_ids == free.output_ids[:1] and ended.matched_stop == free.output_ids[0]
    for _ in range(200):
        if engine.scheduler.idle():
            break
        await asyncio.sleep(0.02)
    assert engine.scheduler.idle(), "an abandoned stream must leave the batch"


async def test_text_input_is_tokenised_like_input_ids(served, reference):
    import httpx

    _, url = served
    _, tok = reference
    sampling = {"temperature": 0, "max_new_tokens": 5}
    async with httpx.AsyncClient(base_url=url) as http:
        by_text = (await http.post("/generate", json={"text": "hello world", "sampling_params": sampling})).json()
        by_ids = (await http.post("/generate", json={"input_ids": tok.encode("hello world"),
                                                     "sampling_params": sampling})).json()
    assert by_text["output_ids"] == by_ids["output_ids"] and len(by_text["output_ids"]) >= 1
    assert by_text["meta_info"]["prompt_tokens"] == len(tok.encode("hello world"))


def test_a_wrong_model_path_is_one_clear_error(tmp_path):
    with pytest.raises(EngineError, match="does not exist"):
        EmbeddedEngine(EmbeddedEngineConfig(model=str(tmp_path / "missing")))
    with pytest.raises(EngineError, match="not a Hugging Face checkpoint folder"):
        EmbeddedEngine(EmbeddedEngineConfig(model=str(tmp_path)))


async def test_a_failing_forward_pass_aborts_that_request_only(served, monkeypatch):
    engine, url = served
    real = engine.m.model.forward

    def forward(*args, **kwargs):
        ids = kwargs.get("input_ids")
        # Any prefill holding the poisoned prompt, whatever its row or left padding: the two requests
        # may be prefilled together (either order) or apart, depending on when each arrives.
        if ids is not None and ids.shape[1] > 1 and bool((ids == 77).any()):
            raise RuntimeError("simulated out of memory")
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.m.model, "forward", forward)
    engine.scheduler.call(lambda: time.sleep(0.3))  # both queue up: one prefill that must be split
    async with EngineClient(url) as client:
        bad, good = await asyncio.gather(client.generate([77, 78, 79], GREEDY), client.generate([80, 81], GREEDY))
        assert bad.finish_reason == "abort" and "simulated out of memory" in bad.meta["finish_reason"]["message"]
        assert good.finish_reason == "length" and len(good.output_ids) == GREEDY["max_new_tokens"]
        assert await client.health()


async def test_requests_arriving_together_are_prefilled_together(served, reference, monkeypatch):
    engine, url = served
    _, tok = reference
    prompts = [_prompt(tok, t) for t in ("ls", "write hello to a file named out.txt", "run", "count words")]
    groups: list[int] = []
    real = engine.scheduler._prefill
    monkeypatch.setattr(engine.scheduler, "_prefill", lambda seqs: (groups.append(len(seqs)), real(seqs))[1])
    async with EngineClient(url) as client:
        serial = [await client.generate(p, GREEDY) for p in prompts]
        groups.clear()
        engine.scheduler.call(lambda: time.sleep(0.5))  # hold the scheduler so all four queue up
        together = await asyncio.gather(*[client.generate(p, GREEDY) for p in prompts])
    assert groups == [4], "one left-padded prefill for the four prompts"
    assert [o.output_ids for o in together] == [o.output_ids for o in serial]
    for a, b in zip(together, serial):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= 1e-4


async def test_the_real_context_length_is_reported_and_enforced(tmp_path):
    """Issue 12: the model config's max_position_embeddings, in SGLang's field names and error shape."""
    import httpx

    from openforge.engine.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "short", context_length=64)
    engine = EmbeddedEngine(EmbeddedEngineConfig(model=str(model)))
    try:
        with serve_in_thread(engine.app) as server:
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
                info = (await http.get("/model_info")).json()
                server_info = (await http.get("/get_server_info")).json()
                models = (await http.get("/v1/models")).json()
                fits = await http.post("/generate", json={"input_ids": [5] * 63, "sampling_params": {"max_new_tokens": 8}})
                over = await http.post("/generate", json={"input_ids": [5] * 64})
        assert info["context_length"] == server_info["context_length"] == 64
        assert server_info["max_req_input_len"] == 63 and models["data"][0]["max_model_len"] == 64
        # A 63-token prompt fits and stops at the context's end (one position left for one token).
        assert fits.status_code == 200 and fits.json()["meta_info"]["finish_reason"]["type"] == "length"
        assert fits.json()["meta_info"]["completion_tokens"] == 1
        assert over.status_code == 400 and over.json() == {"error": {"message": (
            "The input (64 tokens) is longer than the model's context length (64 tokens).")}}
    finally:
        engine.close()
