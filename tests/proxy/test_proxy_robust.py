"""Robustness: fuzzed requests in-process (httpx.ASGITransport), restarts, backpressure, batching."""

from __future__ import annotations

import asyncio
import os
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from openforge.engine.client import EngineClient
from openforge.engine.scripted import ScriptedEngine
from openforge.engine.serve import serve_in_thread
from openforge.config import ProxyConfig
from openforge.store import CALL_CLIENT_LEFT, Call
from openforge.proxy.app import create_app
from openforge.proxy.server import ProxyServer
from tests.helpers.proxy_rig import CHAT_TOOLS, TOOL_TURN, make_rig  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(120)

text = st.text(max_size=12)
scalar = st.one_of(st.none(), st.booleans(), st.integers(-3, 5), text)
blob = st.recursive(scalar, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                    st.dictionaries(st.sampled_from(["type", "text", "role", "content", "x"]), inner, max_size=3)),
                    max_leaves=6)
chat_msg = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "bogus"]),
     "content": st.one_of(text, st.none(), st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": text}), max_size=2))},
    optional={"tool_calls": st.lists(st.fixed_dictionaries({"id": text, "type": st.just("function"), "function": st.fixed_dictionaries(
        {"name": st.sampled_from(["bash", ""]), "arguments": st.sampled_from(['{"command": "ls"}', "{", "[]", ""])})}), max_size=2),
        "tool_call_id": text})
anth_block = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": text}),
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": text, "name": st.sampled_from(["bash"]), "input": st.dictionaries(text, text, max_size=2)}),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": text, "content": st.one_of(text, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}), max_size=2))}),
    st.fixed_dictionaries({"type": st.sampled_from(["thinking", "image", "weird"])}),
)
anth_msg = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]),
                                  "content": st.one_of(text, st.lists(anth_block, max_size=3))})
resp_item = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "developer", "x"]), "content": st.one_of(text, st.lists(st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text", "input_image"]), "text": text}), max_size=2))}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": text, "name": st.just("bash"), "arguments": st.sampled_from(['{"command": "ls"}', "nope"])}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": text, "output": text}),
    st.fixed_dictionaries({"type": st.sampled_from(["reasoning", "mystery"])}),
)
requests = st.one_of(
    st.tuples(st.just("/v1/chat/completions"), st.fixed_dictionaries(
        {"model": st.just("m"), "messages": st.one_of(st.lists(chat_msg, max_size=4), blob)},
        optional={"stream": st.booleans(), "max_tokens": st.one_of(st.integers(-1, 4), text), "n": st.integers(0, 2),
                  "tools": st.one_of(st.just(CHAT_TOOLS), blob), "stop": st.one_of(text, blob), "temperature": scalar})),
    st.tuples(st.just("/v1/messages"), st.fixed_dictionaries(
        {"model": st.just("m"), "messages": st.one_of(st.lists(anth_msg, max_size=4), blob)},
        optional={"max_tokens": st.one_of(st.integers(0, 4), scalar), "stream": st.booleans(), "system": st.one_of(text, blob),
                  "tool_choice": blob})),
    st.tuples(st.just("/v1/responses"), st.fixed_dictionaries(
        {"model": st.just("m"), "input": st.one_of(text, st.lists(resp_item, max_size=4), blob)},
        optional={"stream": st.booleans(), "instructions": st.one_of(text, scalar), "max_output_tokens": scalar})),
)


def _error_shape(path: str, body: dict) -> bool:
    if path == "/v1/messages":
        return body.get("type") == "error" and isinstance(body["error"]["message"], str)
    return isinstance(body.get("error", {}).get("message"), str)


@pytest.fixture
def asgi(tiny_model, store):
    # The proxy in-process (fast under hypothesis), the engine on loopback as it ships.
    engine = ScriptedEngine(tiny_model, lambda ids: "ok")
    served = serve_in_thread(engine.app)
    loop = asyncio.new_event_loop()
    client_engine = EngineClient(served.url)
    app = create_app(ProxyConfig(max_context_tokens=4096, default_max_tokens=4), store_path=store.path,
                     engine=client_engine, tokenizer=AutoTokenizer.from_pretrained(str(tiny_model)))
    run = store.create_run(kind="proxy")
    ro = store.create_rollout(run_id=run.id, task_id="t", status="running")
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy",
                             headers={"authorization": f"Bearer {ro.key}"})
    yield loop, http, app, ro
    loop.run_until_complete(http.aclose())
    loop.run_until_complete(app.state.proxy.aclose())
    loop.run_until_complete(client_engine.aclose())
    loop.close()
    served.stop()


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(req=requests)
def test_fuzzed_requests_get_a_200_or_the_apis_error_shape(asgi, req):
    loop, http, app, _ = asgi
    path, body = req
    resp = loop.run_until_complete(http.post(path, json=body))
    assert resp.status_code in (200, 400), resp.text
    if resp.status_code == 400:
        assert _error_shape(path, resp.json()), resp.text
    elif body.get("stream"):
        assert resp.headers["content-type"].startswith("text/event-stream") and "data:" in resp.text
    else:
        assert resp.json().get("model") == "m"


def test_in_process_call_is_recorded_before_the_response_returns(asgi, store):
    loop, http, app, ro = asgi
    resp = loop.run_until_complete(http.post("/v1/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": "hi"}]}))
    assert resp.status_code == 200
    calls = store.list_calls(rollout_id=ro.id)  # read right away, by another connection
    assert [c.status for c in calls] == ["ok"] and calls[0].response_json["id"] == resp.json()["id"]


def test_restart_interrupts_stale_calls_and_keeps_reusing_tokens(make_rig, store, tiny_model):
    rig = make_rig([TOOL_TURN, "done"])
    msgs = [{"role": "user", "content": "list"}]
    first = httpx.post(rig.url + "/v1/chat/completions", headers={"authorization": f"Bearer {rig.key}"},
                       json={"model": "m", "messages": msgs, "tools": CHAT_TOOLS}, timeout=20).json()
    rig.proxy.stop()
    # The run's owner (this process) restarts its proxy: what the old one left in flight is stale.
    store.update_run(rig.rollout.run_id, owner_pid=os.getpid())
    store.add_call(Call(run_id=rig.rollout.run_id, rollout_id=rig.rollout.id, seq=1, status="in_flight"))
    again = ProxyServer(ProxyConfig(), store_path=store.path, engine_url=rig.engine_server.url,
                        model_path=tiny_model).start()
    try:
        assert again.interrupted_on_start == 1
        msg = first["choices"][0]["message"]
        msgs += [msg, {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "a.txt"}]
        httpx.post(again.url + "/v1/chat/completions", headers={"authorization": f"Bearer {rig.key}"},
                   json={"model": "m", "messages": msgs, "tools": CHAT_TOOLS}, timeout=20).raise_for_status()
    finally:
        again.stop()
    calls = rig.calls()
    assert [c.status for c in calls] == ["ok", "interrupted", "ok"] and calls[2].seq == 2
    assert calls[2].prompt_ids[:len(calls[0].prompt_ids) + calls[0].completion_tokens] == \
        calls[0].prompt_ids + calls[0].completion_ids  # reuse survived the restart


def test_a_crashed_runs_keys_stop_working_when_a_proxy_starts(make_rig, store, tiny_model):
    rig = make_rig(["ok"])
    rig.proxy.stop()
    store.update_run(rig.rollout.run_id, owner_pid=2**22 + 12345)  # its driving process is gone
    store.add_call(Call(run_id=rig.rollout.run_id, rollout_id=rig.rollout.id, seq=0, status="in_flight"))
    again = ProxyServer(ProxyConfig(), store_path=store.path, engine_url=rig.engine_server.url,
                        model_path=tiny_model).start()
    try:
        resp = httpx.post(again.url + "/v1/chat/completions", headers={"authorization": f"Bearer {rig.key}"},
                          json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}, timeout=20)
    finally:
        again.stop()
    assert resp.status_code == 401 and "no live rollout" in resp.json()["error"]["message"]
    assert store.get_run(rig.rollout.run_id).status == "interrupted"
    assert store.get_rollout(rig.rollout.id).status == "interrupted"
    assert [c.status for c in rig.calls()] == ["interrupted"]


async def _burst(url: str, key: str, n: int, stream: bool) -> list[int]:
    async with httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {key}"}, timeout=30) as http:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
        return [r.status_code for r in await asyncio.gather(*[http.post("/v1/chat/completions", json=body)
                                                              for _ in range(n)])]


def test_concurrency_limit_queues_then_refuses(make_rig):
    rig = make_rig(lambda ids: "one two three", token_delay_s=0.05, max_concurrent_calls=1)
    codes = asyncio.run(_burst(rig.url, rig.key, 8, stream=True))
    assert codes.count(200) >= 5 and set(codes) <= {200, 429}
    assert 429 in codes  # more than 4x the limit waiting: refused with a retryable 429
    assert len([c for c in rig.calls() if c.status == "ok"]) == codes.count(200)


def test_concurrent_calls_share_commits(make_rig):
    rig = make_rig(lambda ids: "fine")
    codes = asyncio.run(_burst(rig.url, rig.key, 16, stream=False))
    recorder = rig.proxy.app.state.proxy.recorder
    assert codes == [200] * 16 and recorder.writes == 32
    assert recorder.commits < recorder.writes  # group commits: several rows per transaction


def test_client_disconnecting_mid_stream_ends_the_row_and_frees_the_slot(make_rig):
    rig = make_rig(lambda ids: "one two three four five six seven eight nine ten", token_delay_s=0.1,
                   max_concurrent_calls=1)
    with httpx.Client(base_url=rig.url, headers={"authorization": f"Bearer {rig.key}"}, timeout=20) as http:
        with http.stream("POST", "/v1/chat/completions", json={
                "model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}) as resp:
            next(resp.iter_lines())  # the first chunk came; then the client goes away
    deadline = time.monotonic() + 10
    while rig.calls()[0].status == "in_flight" and time.monotonic() < deadline:
        time.sleep(0.05)
    call = rig.calls()[0]
    assert call.status == "error" and call.error == CALL_CLIENT_LEFT  # what the runner never counts as infra
    # The slot was given back: the next call is served, not queued forever behind the dead one.
    rig.engine.script = lambda ids: "ok"
    out = httpx.post(rig.url + "/v1/chat/completions", headers={"authorization": f"Bearer {rig.key}"},
                     json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}, timeout=10)
    assert out.status_code == 200


def test_a_bug_in_translation_is_an_api_error_and_frees_the_slot(make_rig, monkeypatch):
    import openforge.proxy.openai_chat as chat

    rig = make_rig(lambda ids: "fine", max_concurrent_calls=1)
    monkeypatch.setattr(chat, "response_json", lambda *a, **k: 1 / 0)
    monkeypatch.setattr(chat.Stream, "event", lambda self, ev: 1 / 0)
    headers = {"authorization": f"Bearer {rig.key}"}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    plain = httpx.post(rig.url + "/v1/chat/completions", headers=headers, json=body, timeout=10)
    assert plain.status_code == 500 and "ZeroDivisionError" in plain.json()["error"]["message"]
    streamed = httpx.post(rig.url + "/v1/chat/completions", headers=headers, json={**body, "stream": True}, timeout=10)
    assert streamed.status_code == 200 and '"error"' in streamed.text  # the stream ends with an error event
    assert [c.status for c in rig.calls()] == ["error", "error"]
    monkeypatch.undo()
    assert httpx.post(rig.url + "/v1/chat/completions", headers=headers, json=body, timeout=10).status_code == 200
