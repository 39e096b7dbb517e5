"""Limits and hostile input: context errors in each API's shape, the sampling recorded, a huge prompt
that must not freeze the proxy, lone surrogates, unknown routes, the engine key, clients that leave."""

from __future__ import annotations

import asyncio
import logging
import time

import anthropic
import httpx
import openai
import pytest

from openforge.proxy import api_adapters
from openforge.proxy.api_adapters import ADAPTERS, ApiAdapter
from tests.helpers.proxy_rig import make_rig  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(90)
MSGS = [{"role": "user", "content": "hi"}]


def oai(rig, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=rig.url + "/v1", api_key=rig.key, max_retries=0, timeout=30, **kw)


def test_every_api_module_is_an_adapter():
    assert set(ADAPTERS) == {"openai_chat", "openai_responses", "anthropic_messages"}
    for name, module in ADAPTERS.items():
        assert isinstance(module, ApiAdapter) and module.API == name
    assert api_adapters.adapter_for_path("/r/k/v1/messages/x").API == "anthropic_messages"


def test_a_prompt_over_the_engines_context_is_a_400_in_each_apis_shape(make_rig):
    rig = make_rig(["fits"])
    rig.engine.context_length = 200  # what the engine reports on /model_info
    long = [{"role": "user", "content": "word " * 400}]
    with pytest.raises(openai.BadRequestError) as chat:
        oai(rig).chat.completions.create(model="m", messages=long)
    assert chat.value.status_code == 400 and chat.value.code == "context_length_exceeded"
    assert "prompt is too long" in chat.value.message
    with pytest.raises(openai.BadRequestError) as resp:
        oai(rig).responses.create(model="m", input="word " * 400)
    assert resp.value.code == "context_length_exceeded"
    claude = anthropic.Anthropic(base_url=rig.url, api_key=rig.key, max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as msg:
        claude.messages.create(model="m", max_tokens=16, messages=long)
    assert msg.value.status_code == 400 and msg.value.body["error"]["type"] == "invalid_request_error"
    assert "prompt is too long" in msg.value.body["error"]["message"]
    assert rig.engine.requests == []  # refused before any engine call; each recorded as refused (issue 44)
    refused = rig.calls()
    assert [c.status for c in refused] == ["refused"] * 3 and all("prompt is too long" in c.error for c in refused)
    assert all(c.prompt_tokens > 200 and c.policy_turns == 0 and c.prompt_ids is None for c in refused)
    # A prompt that fits is served, its completion cut to the room left (prompt + max_new < context).
    out = oai(rig).chat.completions.create(model="m", messages=MSGS, max_tokens=10_000)
    sent = rig.engine.requests[-1]
    assert out.choices[0].message.content == "fits"
    assert len(sent["input_ids"]) + sent["sampling_params"]["max_new_tokens"] == 199


def test_the_configured_limit_can_only_lower_the_engines(make_rig):
    rig = make_rig(["ok"], max_context_tokens=64)
    rig.engine.context_length = 100_000
    with pytest.raises(openai.BadRequestError, match="prompt is too long"):
        oai(rig).chat.completions.create(model="m", messages=[{"role": "user", "content": "word " * 100}])
    assert asyncio.run(rig.proxy.app.state.proxy.pipeline.context_limit()) == 64


def test_a_prompt_whose_bytes_prove_it_too_long_is_refused_before_tokenising(make_rig, monkeypatch):
    rig = make_rig([], max_context_tokens=1000)
    renderer = rig.proxy.app.state.proxy.renderer
    encoded: list[int] = []
    real = renderer.encode
    monkeypatch.setattr(renderer, "encode", lambda text: encoded.append(len(text)) or real(text))
    huge = "x" * (renderer.max_token_bytes * 1000 + 10)
    with pytest.raises(openai.BadRequestError, match="at least"):
        oai(rig).chat.completions.create(model="m", messages=[{"role": "user", "content": huge}])
    assert encoded == []


def test_the_effective_sampling_is_sent_and_recorded(make_rig):
    rig = make_rig(["a", "b", "c"], sampling="harness")
    oai(rig).chat.completions.create(model="m", messages=MSGS)  # what Codex and Claude Code do: send none
    oai(rig).chat.completions.create(model="m", messages=MSGS, temperature=0.7, top_p=0.9,
                                     extra_body={"top_k": 20})
    anthropic.Anthropic(base_url=rig.url, api_key=rig.key, max_retries=0).messages.create(
        model="m", max_tokens=8, messages=MSGS, extra_body={"temperature": 0.3, "top_k": 5})
    recorded = [(c.temperature, c.top_p, c.top_k) for c in rig.calls()]
    assert recorded == [(1.0, 1.0, -1), (0.7, 0.9, 20), (0.3, 1.0, 5)]
    sent = [(r["sampling_params"]["temperature"], r["sampling_params"]["top_p"], r["sampling_params"]["top_k"])
            for r in rig.engine.requests]
    assert sent == recorded


def test_the_temperature_override_is_what_is_recorded(make_rig):
    rig = make_rig(["a"], temperature_override=1.0)
    oai(rig).chat.completions.create(model="m", messages=MSGS, temperature=0.2)
    assert rig.calls()[0].temperature == 1.0 and rig.engine.requests[0]["sampling_params"]["temperature"] == 1.0


async def _health_while(url: str, key: str, body: dict) -> tuple[httpx.Response, list[float]]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        big = asyncio.create_task(http.post("/v1/chat/completions", json=body,
                                            headers={"authorization": f"Bearer {key}"}))
        waits = []
        while not big.done():
            t = time.perf_counter()
            assert (await http.get("/health")).status_code == 200
            waits.append(time.perf_counter() - t)
            await asyncio.sleep(0.05)
        return await big, waits


@pytest.mark.slow
def test_health_answers_while_a_huge_prompt_is_tokenised(make_rig):
    rig = make_rig([])
    rig.engine.context_length = 200_000  # over the byte bound (~95k), under the real count (~840k): tokenised
    text = "".join(f"w{i % 997} " for i in range(300_000))  # ~1.5 MB: seconds of tokenising
    resp, waits = asyncio.run(_health_while(rig.url, rig.key, {"model": "m", "messages": [
        {"role": "user", "content": text}]}))
    assert resp.status_code == 400 and "prompt is too long" in resp.json()["error"]["message"]
    assert len(waits) >= 3  # it took a while, and /health was asked throughout
    assert sorted(waits)[len(waits) // 2] < 0.5 and max(waits) < 3.0


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", '{"model": "m", "messages": [{"role": "user", "content": "a\\ud800b"}]}'),
    ("/v1/responses", '{"model": "m", "input": "\\udfff"}'),
    ("/v1/messages", '{"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "\\ud800"}]}'),
    ("/v1/messages/count_tokens", '{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}'),
    ("/v1/chat/completions", '{"model": "\\ud800", "messages": [{"role": "user", "content": "x"}]}'),
])
def test_a_lone_surrogate_is_a_400(make_rig, path, body):
    rig = make_rig(["ok"])
    resp = httpx.post(rig.url + path, content=body.encode(), headers={"authorization": f"Bearer {rig.key}",
                                                                        "content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    message = resp.json()["error"]["message"]
    assert "surrogate" in message
    # A valid pair, as ensure_ascii encoders write an emoji, is fine.
    ok = httpx.post(rig.url + "/v1/chat/completions", headers={"authorization": f"Bearer {rig.key}"},
                    content=b'{"model": "m", "messages": [{"role": "user", "content": "\\ud83d\\ude42"}]}')
    assert ok.status_code == 200


def test_unknown_paths_and_methods_answer_in_the_apis_shape(make_rig):
    rig = make_rig([])
    nope = httpx.post(rig.url + "/v1/completions", json={})
    assert nope.status_code == 404 and nope.json()["error"]["type"] == "invalid_request_error"
    assert "no such endpoint: POST /v1/completions" in nope.json()["error"]["message"]
    wrong = httpx.get(rig.url + "/v1/messages")
    assert wrong.status_code == 405 and wrong.json()["type"] == "error"
    assert wrong.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(rig.url + "/r/key/v1/nothing").json()["error"]["message"].startswith("no such endpoint")


def test_the_engine_key_reaches_the_engine(make_rig):
    rig = make_rig(["served"], engine_key="engine-secret")
    assert oai(rig).chat.completions.create(model="m", messages=MSGS).choices[0].message.content == "served"
    keyless = make_rig(["never"], engine_key="engine-secret", proxy_engine_key=None)
    with pytest.raises(openai.InternalServerError) as refused:
        oai(keyless).chat.completions.create(model="m", messages=MSGS)
    assert refused.value.status_code == 500 and "refused the proxy" in refused.value.message


def test_a_client_leaving_mid_stream_is_one_log_line(make_rig, caplog):
    rig = make_rig(lambda ids: "one two three four five six seven eight", token_delay_s=0.1)
    with caplog.at_level(logging.INFO):
        with httpx.Client(base_url=rig.url, headers={"authorization": f"Bearer {rig.key}"}, timeout=20) as http:
            with http.stream("POST", "/v1/chat/completions", json={"model": "m", "messages": MSGS,
                                                                   "stream": True}) as resp:
                next(resp.iter_lines())
        deadline = time.monotonic() + 10
        while rig.calls()[0].status == "in_flight" and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
    assert rig.calls()[0].status == "error"
    left = [r for r in caplog.records if "left" in r.getMessage() and "stream" in r.getMessage()]
    assert len(left) == 1 and left[0].exc_info is None
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records if r.exc_info]


def test_each_call_records_why_its_prompt_broke_the_prefix(make_rig):
    from tests.helpers.proxy_rig import CHAT_TOOLS, TOOL_TURN

    rig = make_rig([TOOL_TURN, "done", "again", "fresh"])
    c = oai(rig)
    msgs = [{"role": "user", "content": "list"}]
    msg = c.chat.completions.create(model="m", messages=msgs, tools=CHAT_TOOLS).choices[0].message
    msgs += [msg.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": msg.tool_calls[0].id,
                                                 "content": "a.txt"}]
    c.chat.completions.create(model="m", messages=msgs, tools=CHAT_TOOLS)  # extends the first call
    edited = [msgs[0], {"role": "assistant", "content": "something it never said"}, {"role": "user", "content": "go"}]
    c.chat.completions.create(model="m", messages=edited, tools=CHAT_TOOLS)  # a rewritten history
    c.chat.completions.create(model="m", messages=[{"role": "user", "content": "new task"}])  # a sub-agent
    reasons = [call.break_reason for call in rig.calls()]
    assert reasons[:2] == [None, None]
    # Explained against the previous call's messages (proxy/breaks.py), not just "no match".
    assert reasons[2].startswith("history rewritten:") and reasons[3].startswith("new conversation:")


def test_the_engine_is_asked_its_context_once_even_when_it_reports_none(make_rig, monkeypatch):
    rig = make_rig(["a", "b", "c"])
    pipeline = rig.proxy.app.state.proxy.pipeline
    asked = []

    async def reports_none() -> None:  # an older SGLang: no route gives a context length
        asked.append(1)

    monkeypatch.setattr(pipeline.engine, "context_length", reports_none)
    for _ in range(3):
        oai(rig).chat.completions.create(model="m", messages=MSGS)
    assert asked == [1] and asyncio.run(pipeline.context_limit()) is None


def test_max_tokens_cap_bounds_what_any_call_may_generate(make_rig):
    """`proxy.max_tokens_cap`: Claude Code asks for 32,000 tokens on every call; the engine is asked
    for at most the cap, and a request below it keeps its own."""
    rig = make_rig(["ok"] * 3, max_tokens_cap=2)
    claude = anthropic.Anthropic(base_url=rig.url, api_key=rig.key, max_retries=0)
    with claude.messages.stream(model="m", max_tokens=32_000, messages=MSGS) as stream:
        stream.get_final_message()
    assert rig.engine.requests[-1]["sampling_params"]["max_new_tokens"] == 2
    oai(rig).chat.completions.create(model="m", messages=MSGS, max_tokens=1)
    assert rig.engine.requests[-1]["sampling_params"]["max_new_tokens"] == 1
    oai(rig).chat.completions.create(model="m", messages=MSGS)  # none asked: the default, capped
    assert rig.engine.requests[-1]["sampling_params"]["max_new_tokens"] == 2


def test_an_answer_ending_its_turn_on_the_last_allowed_token_is_a_stop(make_rig):
    """SGLang (and the engines here) report "length" when the last allowed token is the end of turn;
    the model did end its turn, so the APIs say so (Claude Code fails a rollout on max_tokens)."""
    rig = make_rig(["4", "4", "four"], max_tokens_cap=2)  # "4" is one token + <|im_end|>
    claude = anthropic.Anthropic(base_url=rig.url, api_key=rig.key, max_retries=0)
    with claude.messages.stream(model="m", max_tokens=32_000, messages=MSGS) as stream:
        msg = stream.get_final_message()
    assert msg.stop_reason == "end_turn" and msg.content[0].text == "4"
    assert oai(rig).chat.completions.create(model="m", messages=MSGS).choices[0].finish_reason == "stop"
    cut = oai(rig).chat.completions.create(model="m", messages=MSGS)  # "four": 2 tokens of text, no end
    assert cut.choices[0].finish_reason == "length"
