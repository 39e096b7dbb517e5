"""The proxy through the official `anthropic` SDK (what Claude Code speaks), over loopback."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from openforge.rollouts.runner.trajectory import assemble_rollout
from tests.helpers.proxy_rig import ANTHROPIC_TOOLS, TOOL_TURN, make_rig  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(60)


def client(rig, key=None, **kw) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=rig.url, api_key=key or rig.key, max_retries=kw.pop("max_retries", 0),
                               timeout=20, **kw)


def test_tool_use_loop_streaming_extends_the_first_call(make_rig):
    rig = make_rig([TOOL_TURN, "There is one file."])
    c = client(rig)
    msgs = [{"role": "user", "content": "list the files"}]
    with c.messages.stream(model="claude-x", max_tokens=200, system="You are terse.", messages=msgs,
                           tools=ANTHROPIC_TOOLS) as stream:
        kinds = [ev.type for ev in stream]
        first = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds and "message_delta" in kinds
    assert first.stop_reason == "tool_use"
    text, use = first.content
    assert text.text == "Let me look." and use.type == "tool_use" and use.input == {"command": "ls"}
    assert use.id.startswith("toolu_")
    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a.txt"}]}]
    second = c.messages.create(model="claude-x", max_tokens=200, system="You are terse.", messages=msgs,
                               tools=ANTHROPIC_TOOLS)
    assert second.content[0].text == "There is one file." and second.stop_reason == "end_turn"
    assert second.usage.input_tokens == len(rig.calls()[1].prompt_ids)
    stats = assemble_rollout(rig.store, rig.rollout.id)
    assert (stats["n_segments"], stats["n_extends"]) == (1, 1)
    assert rig.calls()[1].reused_tokens == rig.calls()[0].completion_tokens
    assert rig.served_texts() == [TOOL_TURN, "There is one file."]


def test_streamed_and_plain_answers_agree(make_rig):
    rig = make_rig([TOOL_TURN, TOOL_TURN])
    c = client(rig)
    kw = dict(model="m", max_tokens=100, messages=[{"role": "user", "content": "x"}], tools=ANTHROPIC_TOOLS)
    plain = c.messages.create(**kw)
    with c.messages.stream(**kw) as s:
        streamed = s.get_final_message()
    strip = lambda m: [(b.type, getattr(b, "text", None), getattr(b, "input", None)) for b in m.content]  # noqa: E731
    assert strip(plain) == strip(streamed)
    assert plain.usage.output_tokens == streamed.usage.output_tokens


def test_count_tokens_matches_the_prompt_the_call_uses(make_rig):
    rig = make_rig(["ok"])
    c = client(rig)
    kw = dict(model="m", messages=[{"role": "user", "content": "count me"}], tools=ANTHROPIC_TOOLS)
    counted = c.messages.count_tokens(**kw).input_tokens
    assert c.messages.create(max_tokens=10, **kw).usage.input_tokens == counted
    assert len(rig.calls()) == 1  # counting records nothing


def test_errors_in_anthropic_shape(make_rig):
    rig = make_rig(["never"])
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.AuthenticationError) as bad:
        client(rig, key="nope").messages.create(model="m", max_tokens=5, messages=msgs)
    assert bad.value.body["type"] == "error" and bad.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.BadRequestError, match="does not take images"):  # a text-only model
        client(rig).messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgoAAAANSUhEUgAAAAQAAAAECAIAAAAmkwkpAAAAEElEQVR4nGP8z4AATAxEcQAz0QEHOoQ+uAAAAABJRU5ErkJggg=="}}]}])
    resp = httpx.post(rig.url + "/v1/messages", json={"model": "m", "messages": msgs},
                      headers={"x-api-key": rig.key, "anthropic-version": "2023-06-01"})
    assert resp.status_code == 400 and resp.json()["error"]["message"] == "max_tokens: field required"
    rig.engine.fail_next("http_500")
    with pytest.raises(anthropic.APIStatusError) as over:
        client(rig).messages.create(model="m", max_tokens=5, messages=msgs)
    assert over.value.status_code == 529 and over.value.body["error"]["type"] == "overloaded_error"


def test_stop_sequences(make_rig):
    rig = make_rig(["one two END three"])
    out = client(rig).messages.create(model="m", max_tokens=50, stop_sequences=["END"],
                                      messages=[{"role": "user", "content": "x"}])
    assert out.content[0].text == "one two " and out.stop_reason == "stop_sequence" and out.stop_sequence == "END"
