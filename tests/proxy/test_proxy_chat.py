"""The proxy through the official `openai` SDK, Chat Completions, over loopback (uvicorn)."""

from __future__ import annotations


import httpx
import openai
import pytest

from openforge.rollouts.runner.trajectory import assemble_rollout
from tests.helpers.proxy_rig import CHAT_TOOLS, TOOL_TURN, make_rig, tool_args  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(60)


def client(rig, key=None, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=rig.url + "/v1", api_key=key or rig.key, max_retries=kw.pop("max_retries", 0),
                         timeout=20, **kw)


def test_tool_loop_reuses_sampled_tokens_and_assembles_one_segment(make_rig):
    rig = make_rig([TOOL_TURN, "There is one file: a.txt"])
    c = client(rig)
    msgs = [{"role": "user", "content": "list the files"}]
    first = c.chat.completions.create(model="policy", messages=msgs, tools=CHAT_TOOLS)
    msg = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    assert msg.content == "Let me look."
    assert msg.tool_calls[0].function.name == "bash" and tool_args(msg.tool_calls[0]) == {"command": "ls"}
    assert msg.tool_calls[0].function.arguments == '{"command":"ls"}'  # the model's own text
    msgs += [msg.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "a.txt"}]
    second = c.chat.completions.create(model="policy", messages=msgs, tools=CHAT_TOOLS)
    assert second.choices[0].message.content == "There is one file: a.txt"
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + first.usage.completion_tokens

    calls = rig.calls()
    assert [c.status for c in calls] == ["ok", "ok"] and [c.seq for c in calls] == [0, 1]
    p0, c0, p1 = calls[0].prompt_ids, calls[0].completion_ids, calls[1].prompt_ids
    assert p1[:len(p0) + len(c0)] == p0 + c0  # the second prompt extends the first exactly
    assert calls[1].reused_tokens == len(c0)
    # Re-tokenising the replayed history would have given other ids (the template re-spaces the JSON).
    tok = rig.engine.tokenizer
    naive = tok.apply_chat_template(msgs, tools=CHAT_TOOLS, tokenize=False, add_generation_prompt=True)
    assert tok.encode(naive, add_special_tokens=False) != p1

    stats = assemble_rollout(rig.store, rig.rollout.id)
    assert stats["n_segments"] == 1 and stats["n_extends"] == 1
    traj = rig.store.list_trajectories(rollout_ids=[rig.rollout.id])[0]
    ids, mask, lps = traj.token_ids, traj.loss_mask, traj.logprobs
    assert ids == p1 + calls[1].completion_ids
    sampled = [t for t, m in zip(ids, mask) if m]
    assert sampled == c0 + calls[1].completion_ids
    assert [lp for lp, m in zip(lps, mask) if m] == calls[0].logprobs + calls[1].logprobs
    assert all(lp == 0.0 for lp, m in zip(lps, mask) if not m)
    assert tok.decode(c0, skip_special_tokens=True) == TOOL_TURN
    assert rig.store.get_rollout(rig.rollout.id).n_segments == 1


def test_streaming_matches_non_streaming(make_rig):
    rig = make_rig([TOOL_TURN, TOOL_TURN, "Hello there, world"])
    c = client(rig)
    msgs = [{"role": "user", "content": "go"}]
    plain = c.chat.completions.create(model="m", messages=msgs, tools=CHAT_TOOLS)
    chunks = list(c.chat.completions.create(model="m", messages=msgs, tools=CHAT_TOOLS, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    calls = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert text == plain.choices[0].message.content
    # Arguments stream in pieces as the model writes them (the name and id come first), joined by index.
    assert len(calls) > 2 and calls[0].function.name == "bash" and calls[0].id
    joined = [(c.function.name, "".join(d.function.arguments for d in calls if d.index == c.index))
              for c in calls if c.function.name]
    assert joined == [(t.function.name, t.function.arguments) for t in plain.choices[0].message.tool_calls]
    assert finish == ["tool_calls"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens

    # Text streams in several deltas, not one buffered blob.
    stream = c.chat.completions.create(model="m", messages=msgs, stream=True, logprobs=True)
    deltas = [ch.choices[0].delta.content for ch in stream if ch.choices and ch.choices[0].delta.content]
    assert len(deltas) >= 3 and "".join(deltas) == "Hello there, world"
    assert all(c.status == "ok" for c in rig.calls())


def test_logprobs_are_the_sampled_ones(make_rig):
    rig = make_rig(["Hello world"])
    out = client(rig).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], logprobs=True)
    got = [t.logprob for t in out.choices[0].logprobs.content]
    recorded = rig.calls()[0].logprobs
    assert got == recorded[:len(got)] and len(got) == len(recorded) - 1  # the end-of-turn token is not content
    assert "".join(t.token for t in out.choices[0].logprobs.content) == "Hello world"


def test_wrong_ended_and_missing_keys_get_401_in_openai_shape(make_rig):
    rig = make_rig(["ok"] * 4)
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.AuthenticationError) as bad:
        client(rig, key="forge-not-a-key").chat.completions.create(model="m", messages=msgs)
    assert bad.value.status_code == 401 and bad.value.body["code"] == "invalid_api_key"
    ended = rig.new_rollout(status="scored")
    with pytest.raises(openai.AuthenticationError, match="no live rollout"):
        client(rig, key=ended.key).chat.completions.create(model="m", messages=msgs)
    resp = httpx.post(rig.url + "/v1/chat/completions", json={"model": "m", "messages": msgs})
    assert resp.status_code == 401 and resp.json()["error"]["type"] == "invalid_request_error"
    # The path-prefix form works for harnesses that cannot set a key.
    out = openai.OpenAI(base_url=f"{rig.url}/r/{rig.key}/v1", api_key="ignored", max_retries=0) \
        .chat.completions.create(model="m", messages=msgs)
    assert out.choices[0].message.content == "ok"
    assert len(rig.calls()) == 1 and rig.calls(ended.id) == []


def test_a_rollout_cannot_reuse_or_write_another_rollouts_records(make_rig):
    rig = make_rig([TOOL_TURN, "done", "done"])
    other = rig.new_rollout()
    msgs = [{"role": "user", "content": "list"}]
    msg = client(rig).chat.completions.create(model="m", messages=msgs, tools=CHAT_TOOLS).choices[0].message
    replay = msgs + [msg.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "a.txt"}]
    client(rig, key=other.key).chat.completions.create(model="m", messages=replay, tools=CHAT_TOOLS)
    client(rig).chat.completions.create(model="m", messages=replay, tools=CHAT_TOOLS)
    theirs, mine = rig.calls(other.id), rig.calls()
    assert len(theirs) == 1 and len(mine) == 2
    assert theirs[0].reused_tokens == 0  # rollout A's sampled ids never leak into B's prompt
    assert mine[1].reused_tokens > 0
    assert {c.rollout_id for c in mine} == {rig.rollout.id}


def test_engine_failure_is_a_retryable_error_not_a_hang(make_rig):
    rig = make_rig(["recovered", "recovered", "late"], call_timeout_s=2.0)  # the ok call fits 2 s under load
    msgs = [{"role": "user", "content": "hi"}]
    rig.engine.fail_next("http_500")
    with pytest.raises(openai.InternalServerError) as err:
        client(rig).chat.completions.create(model="m", messages=msgs)
    assert err.value.status_code == 503 and "retry" in err.value.message
    rig.engine.fail_next("http_500")  # the SDK's own retry recovers
    out = client(rig, max_retries=2).chat.completions.create(model="m", messages=msgs)
    assert out.choices[0].message.content == "recovered"
    rig.engine.fail_next("delay", seconds=6)
    with pytest.raises(openai.APIStatusError) as slow:
        client(rig).chat.completions.create(model="m", messages=msgs)
    assert slow.value.status_code == 504
    assert [c.status for c in rig.calls()] == ["error", "error", "ok", "error"]


def test_engine_dropping_the_stream_midway_ends_it_with_an_error_event(make_rig):
    rig = make_rig(["one two three four five six seven"])
    rig.engine.fail_next("disconnect", after_tokens=3)
    stream = client(rig).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
    with pytest.raises(openai.APIError):
        for _ in stream:
            pass
    call = rig.calls()[0]
    assert call.status == "error" and "stream" in call.error


def test_bad_requests_get_openai_errors(make_rig):
    rig = make_rig(["ok"], max_body_bytes=4096)
    c = client(rig)
    with pytest.raises(openai.BadRequestError, match="n=1"):
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], n=2)
    with pytest.raises(openai.BadRequestError, match="does not take images"):  # a text-only model
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAQAAAAECAIAAAAmkwkpAAAAEElEQVR4nGP8z4AATAxEcQAz0QEHOoQ+uAAAAABJRU5ErkJggg=="}}]}])
    with pytest.raises(openai.APIStatusError) as big:
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 5000}])
    assert big.value.status_code == 413
    resp = httpx.post(rig.url + "/v1/chat/completions", content=b"{not json",
                      headers={"authorization": f"Bearer {rig.key}"})
    assert resp.status_code == 400 and "not valid JSON" in resp.json()["error"]["message"]
    assert rig.calls() == []  # refused before reaching the engine


def test_malformed_tool_call_comes_back_as_text_and_is_flagged(make_rig):
    bad = 'Trying.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"\n</tool_call>'
    rig = make_rig([bad])
    out = client(rig).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                              tools=CHAT_TOOLS)
    assert out.choices[0].message.tool_calls is None
    assert out.choices[0].message.content == bad and out.choices[0].finish_reason == "stop"
    assert rig.calls()[0].tool_parse_error is True


def test_stop_strings_and_max_tokens(make_rig):
    rig = make_rig(["alpha beta STOP gamma", "one two three four five six"])
    c = client(rig)
    out = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stop=["STOP"])
    assert out.choices[0].message.content == "alpha beta " and out.choices[0].finish_reason == "stop"
    out = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 2
    assert rig.calls()[1].request_json["max_tokens"] == 2


def test_models_and_health(make_rig):
    rig = make_rig([])
    assert [m.id for m in client(rig).models.list()] == ["forge-policy"]
    assert httpx.get(rig.url + "/health").json()["status"] == "ok"


def test_rollout_adapter_and_sampling_reach_the_engine(make_rig):
    rig = make_rig(["ok", "ok"], temperature_override=0.0, sampling="harness")
    rig.engine.adapters["step-3"] = "/adapters/step-3"
    tuned = rig.store.create_rollout(run_id=rig.rollout.run_id, task_id="t", status="running", adapter="step-3")
    msgs = [{"role": "user", "content": "hi"}]
    client(rig, key=tuned.key).chat.completions.create(model="m", messages=msgs, temperature=0.9, top_p=0.5,
                                                           max_tokens=7)
    client(rig).chat.completions.create(model="m", messages=msgs)
    tuned_req, base_req = rig.engine.requests[-2:]
    assert tuned_req["lora_path"] == "step-3" and "lora_path" not in base_req  # None = the base model
    params = tuned_req["sampling_params"]
    assert params["temperature"] == 0.0 and params["top_p"] == 0.5 and params["max_new_tokens"] == 7
    assert rig.engine.tokenizer.convert_tokens_to_ids("<|im_end|>") in params["stop_token_ids"]
    assert rig.calls(tuned.id)[0].adapter == "step-3"
    assert tuned_req["input_ids"] == rig.calls(tuned.id)[0].prompt_ids  # recorded = what was sent


def test_multibyte_text_streams_without_broken_characters(make_rig):
    text = "héllo wörld ✓ 日本語 🙂 done"
    rig = make_rig([text, text])
    c = client(rig)
    msgs = [{"role": "user", "content": "x"}]
    deltas = [ch.choices[0].delta.content for ch in c.chat.completions.create(model="m", messages=msgs, stream=True)
              if ch.choices and ch.choices[0].delta.content]
    assert "".join(deltas) == text and not any("\ufffd" in d for d in deltas)
    assert c.chat.completions.create(model="m", messages=msgs).choices[0].message.content == text
    assert rig.served_texts() == [text, text]
