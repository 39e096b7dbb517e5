"""engine.kind = "remote": the proxy in front of a teacher, recording its answers in the student's tokens.

The upstreams are fakes on loopback (the one edge that cannot run here), faithful to the wire formats
of OpenAI's Chat Completions and Anthropic's Messages (non-streaming); the harness side is the real
`openai` and `anthropic` SDKs, the student the tiny model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from openforge.config import ProxyConfig, RemoteEngineConfig, load_config
from openforge.engine.serve import serve_in_thread
from openforge.errors import ConfigError
from openforge.proxy.server import ProxyServer
from openforge.proxy.teacher import check_teacher_config
from openforge.rollouts.runner.trajectory import assemble_rollout
from openforge.store import Store
from tests.helpers.proxy_rig import ANTHROPIC_TOOLS, CHAT_TOOLS

pytestmark = pytest.mark.timeout(60)
KEY_ENV = "FORGE_TEST_TEACHER_KEY"


@dataclass
class FakeUpstream:
    """Answers each POST with the next scripted (status, body, headers); keeps what it was sent."""

    replies: list[tuple[int, Any, dict[str, str]]]
    seen: list[dict[str, Any]] = field(default_factory=list)

    def app(self, path: str) -> Starlette:
        async def answer(request: Request) -> JSONResponse:
            self.seen.append({"headers": dict(request.headers), "body": await request.json()})
            status, body, headers = self.replies.pop(0)
            return JSONResponse(body, status_code=status, headers=headers)

        return Starlette(routes=[Route(path, answer, methods=["POST"])])


def openai_reply(content: str | None, tool_calls: list[dict[str, Any]] | None = None) -> tuple[int, Any, dict]:
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return 200, {"id": "chatcmpl-up1", "object": "chat.completion", "created": 1765000000, "model": "teacher-1",
                 "choices": [{"index": 0, "message": message, "logprobs": None,
                              "finish_reason": "tool_calls" if tool_calls else "stop"}],
                 "usage": {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42}}, {}


def anthropic_reply(content: list[dict[str, Any]], stop: str = "end_turn") -> tuple[int, Any, dict]:
    return 200, {"id": "msg_01Up", "type": "message", "role": "assistant", "model": "claude-teacher",
                 "content": content, "stop_reason": stop, "stop_sequence": None,
                 "usage": {"input_tokens": 30, "output_tokens": 12}}, {}


@dataclass
class TeacherRig:
    upstream: FakeUpstream
    proxy: ProxyServer
    store: Store
    key: str
    rollout_id: str

    def calls(self) -> list[Any]:
        return sorted(self.store.list_calls(rollout_id=self.rollout_id), key=lambda c: c.seq)


@pytest.fixture
def make_teacher(tiny_model: Path, store: Store, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv(KEY_ENV, "sk-upstream-secret")
    stops: list[Any] = []

    def make(api: str, replies: list[tuple[int, Any, dict]], **remote: Any) -> TeacherRig:
        upstream = FakeUpstream(list(replies))
        server = serve_in_thread(upstream.app("/v1/messages" if api == "anthropic" else "/v1/chat/completions"))
        stops.append(server.stop)
        config = RemoteEngineConfig(url=server.url, api=api, api_key_env=KEY_ENV, upstream_model="teacher-1",
                                    model=str(tiny_model), backoff_s=0.01, **remote)
        proxy = ProxyServer(ProxyConfig(), store_path=store.path, engine_url="", model_path=tiny_model,
                            teacher=config).start()
        stops.append(proxy.stop)
        run = store.create_run(kind="proxy")
        key = "sk-rollout-1"
        rollout = store.create_rollout(run_id=run.id, task_id="t", status="running", key=key)
        return TeacherRig(upstream, proxy, store, key, rollout.id)

    yield make
    for stop in reversed(stops):
        stop()


def student_turn(tokenizer: Any, messages: list[dict[str, Any]], answer: dict[str, Any], tools: Any) -> tuple[str, str]:
    """(prompt text, completion text) as the student's chat template writes them: the completion is
    the assistant turn up to and including its end-of-turn token."""
    prompt = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(messages + [answer], tools=tools, tokenize=False)
    assert full.startswith(prompt)
    turn = full[len(prompt):]
    return prompt, turn[:turn.rindex("<|im_end|>") + len("<|im_end|>")]


def test_openai_teacher_is_recorded_in_the_students_tokens(make_teacher, tiny_model):
    rig = make_teacher("openai", [
        openai_reply("Let me look.", [{"id": "call_up_1", "type": "function",
                                       "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}]),
        openai_reply("There is one file: a.txt"),
    ])
    client = openai.OpenAI(base_url=rig.proxy.url + "/v1", api_key=rig.key, max_retries=0, timeout=20)
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."},
                                  {"role": "user", "content": "list the files"}]
    first = client.chat.completions.create(model="anything", messages=msgs, tools=CHAT_TOOLS)
    msg = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls" and msg.content == "Let me look."
    assert msg.tool_calls[0].function.name == "bash" and json.loads(msg.tool_calls[0].function.arguments) == {
        "command": "ls"}
    msgs += [msg.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": msg.tool_calls[0].id,
                                                 "content": "a.txt"}]
    second = client.chat.completions.create(model="anything", messages=msgs, tools=CHAT_TOOLS)
    assert second.choices[0].message.content == "There is one file: a.txt"

    # The upstream got OpenAI's wire format: its model id, the key from the environment, the tools, the history.
    sent = rig.upstream.seen
    assert sent[0]["headers"]["authorization"] == "Bearer sk-upstream-secret"
    assert sent[0]["body"]["model"] == "teacher-1" and sent[0]["body"]["stream"] is False
    assert sent[0]["body"]["tools"] == CHAT_TOOLS and sent[0]["body"]["messages"] == msgs[:2]
    replayed = sent[1]["body"]["messages"]
    assert replayed[2]["tool_calls"][0]["function"]["name"] == "bash"
    assert replayed[3] == {"role": "tool", "content": "a.txt", "tool_call_id": msg.tool_calls[0].id}

    calls = rig.calls()
    assert [c.status for c in calls] == ["ok", "ok"]
    assert all(c.retokenized and c.logprobs is None and c.upstream_retries == 0 for c in calls)
    assert calls[0].tool_calls_json == [{"id": msg.tool_calls[0].id, "name": "bash", "arguments": {"command": "ls"}}]
    # The ids are the student's: its template renders the teacher's answer (the tool call in the
    # student's own <tool_call> format), and its tokenizer tokenises it.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    answer = {"role": "assistant", "content": "Let me look.",
              "tool_calls": [{"type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}}]}
    prompt_text, turn_text = student_turn(tok, msgs[:2], answer, CHAT_TOOLS)
    assert "<tool_call>" in turn_text
    assert tok.decode(calls[0].prompt_ids) == prompt_text and tok.decode(calls[0].completion_ids) == turn_text
    assert calls[0].completion_ids == tok.encode(turn_text, add_special_tokens=False)
    last = {"role": "assistant", "content": "There is one file: a.txt"}
    prompt_text, turn_text = student_turn(tok, msgs, last, CHAT_TOOLS)
    assert tok.decode(calls[1].completion_ids) == turn_text
    # Its prompt replays the first answer as recorded (the SDK sends the arguments back as a JSON string,
    # which the template would re-render differently), then the tool result as the template writes it.
    assert prompt_text.endswith(tok.decode(calls[1].prompt_ids[len(calls[0].prompt_ids) + len(calls[0].completion_ids):]))
    # The second prompt extends the first call's ids: one training sequence, the answers masked in.
    p0, c0 = calls[0].prompt_ids, calls[0].completion_ids
    assert calls[1].prompt_ids[:len(p0) + len(c0)] == p0 + c0
    stats = assemble_rollout(rig.store, rig.rollout_id)
    assert stats["n_segments"] == 1
    traj = rig.store.list_trajectories(rollout_ids=[rig.rollout_id])[0]
    assert [t for t, m in zip(traj.token_ids, traj.loss_mask) if m] == c0 + calls[1].completion_ids


def test_anthropic_teacher_streams_to_the_harness(make_teacher, tiny_model):
    rig = make_teacher("anthropic", [
        anthropic_reply([{"type": "text", "text": "Checking."},
                         {"type": "tool_use", "id": "toolu_up1", "name": "bash", "input": {"command": "ls"}}],
                        stop="tool_use"),
        anthropic_reply([{"type": "text", "text": "One file."}]),
    ])
    client = anthropic.Anthropic(base_url=rig.proxy.url, api_key=rig.key, max_retries=0, timeout=20)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "list the files"}]
    with client.messages.stream(model="claude-x", max_tokens=200, system="Be terse.", messages=msgs,
                                tools=ANTHROPIC_TOOLS) as stream:
        first = stream.get_final_message()
    assert first.stop_reason == "tool_use"
    assert [b.type for b in first.content] == ["text", "tool_use"] and first.content[1].input == {"command": "ls"}
    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": first.content[1].id,
                                           "content": "a.txt"}]}]
    second = client.messages.create(model="claude-x", max_tokens=200, system="Be terse.", messages=msgs,
                                    tools=ANTHROPIC_TOOLS)
    assert second.content[0].text == "One file."

    sent = rig.upstream.seen
    assert sent[0]["headers"]["x-api-key"] == "sk-upstream-secret" and sent[0]["headers"]["anthropic-version"]
    body = sent[1]["body"]
    assert body["model"] == "teacher-1" and body["system"] == "Be terse." and body["tools"] == ANTHROPIC_TOOLS
    assert body["messages"][1]["content"][1] == {"type": "tool_use", "id": first.content[1].id, "name": "bash",
                                                 "input": {"command": "ls"}}
    assert body["messages"][2]["content"][0]["type"] == "tool_result"

    calls = rig.calls()
    assert [c.status for c in calls] == ["ok", "ok"] and calls[0].stream and calls[0].retokenized
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    chat = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "list the files"}]
    answer = {"role": "assistant", "content": "Checking.",
              "tool_calls": [{"type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}}]}
    prompt_text, turn_text = student_turn(tok, chat, answer, CHAT_TOOLS)
    assert tok.decode(calls[0].prompt_ids) == prompt_text and tok.decode(calls[0].completion_ids) == turn_text
    assert calls[1].prompt_ids[:len(calls[0].prompt_ids) + len(calls[0].completion_ids)] == \
        calls[0].prompt_ids + calls[0].completion_ids


def test_rate_limit_is_retried_and_counted(make_teacher):
    rig = make_teacher("openai", [(429, {"error": {"message": "Rate limit reached", "type": "requests",
                                                   "code": "rate_limit_exceeded"}}, {"retry-after": "0"}),
                                  openai_reply("Fine.")])
    client = openai.OpenAI(base_url=rig.proxy.url + "/v1", api_key=rig.key, max_retries=0, timeout=20)
    out = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert out.choices[0].message.content == "Fine."
    [call] = rig.calls()
    assert call.status == "ok" and call.upstream_retries == 1 and len(rig.upstream.seen) == 2


def test_an_upstream_that_keeps_failing_fails_the_call(make_teacher):
    down = (503, {"error": {"message": "overloaded"}}, {})
    rig = make_teacher("openai", [down, down, down], max_retries=2)
    client = openai.OpenAI(base_url=rig.proxy.url + "/v1", api_key=rig.key, max_retries=0, timeout=20)
    with pytest.raises(openai.InternalServerError) as err:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert err.value.status_code == 503 and "3 time(s)" in str(err.value)
    [call] = rig.calls()
    assert call.status == "error" and call.upstream_retries == 3 and "HTTP 503" in call.error


def test_a_refused_key_or_the_other_api_is_one_clear_error(make_teacher):
    rig = make_teacher("openai", [(401, {"error": {"message": "Incorrect API key provided"}}, {}),
                                  anthropic_reply([{"type": "text", "text": "hi"}])])
    client = openai.OpenAI(base_url=rig.proxy.url + "/v1", api_key=rig.key, max_retries=0, timeout=20)
    with pytest.raises(openai.InternalServerError) as err:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert "refused the key" in str(err.value) and KEY_ENV in str(err.value)
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert "set engine.api = \"anthropic\"" in str(err.value)
    assert [c.status for c in rig.calls()] == ["error", "error"]
    assert [c.upstream_retries for c in rig.calls()] == [0, 0]  # neither is worth a retry


def test_remote_config_is_checked_before_anything_starts(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    config = load_config(sets=["engine.kind=remote", "engine.url=http://127.0.0.1:9", "engine.upstream_model=t",
                               f"engine.api_key_env={KEY_ENV}"])
    assert isinstance(config.engine, RemoteEngineConfig) and config.engine.api == "openai"
    with pytest.raises(ConfigError, match=f"export {KEY_ENV}="):
        check_teacher_config(config.engine)
    with pytest.raises(ConfigError, match="needs engine.upstream_model"):
        check_teacher_config(config.engine.model_copy(update={"upstream_model": ""}))
