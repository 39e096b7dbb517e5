"""Every parser over every API with each real chat template, through the proxy and the official SDKs.

A tiny model is built with each shipped template (`forge model tiny --template ...`); the scripted
engine makes it write what that family writes (Qwen3's thinking, Qwen3-Coder's XML calls); each API
answers it streamed and not, in its own shapes; the harness-style replay of the answer then extends
the recorded prompt + completion token for token, or records why it could not.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from openforge.engine.scripted import ScriptedEngine
from openforge.engine.serve import serve_in_thread
from openforge.config import ProxyConfig
from openforge.store import Store
from openforge.proxy.breaks import THINKING_DROPPED
from openforge.proxy.server import ProxyServer
from openforge.rollouts.runner.trajectory import assemble_rollout
from tests.helpers.proxy_rig import ANTHROPIC_TOOLS, CHAT_TOOLS, RESPONSES_TOOLS

pytestmark = pytest.mark.timeout(120)

CALL_JSON = '<tool_call>\n{"name":"bash","arguments":{"command":"ls"}}\n</tool_call>'
CALL_XML = "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>"
THINKING = "The user wants the files.\nI will list them."
# What each family writes for "list the files": (the tool-call turn, the final answer).
SCRIPTS = {
    "qwen2.5": ("Let me look.\n" + CALL_JSON, "There is one file."),
    "qwen3": (f"<think>\n{THINKING}\n</think>\n\nLet me look.\n" + CALL_JSON,
              "<think>\nOne file.\n</think>\n\nThere is one file."),
    "qwen3-coder": ("Let me look.\n\n" + CALL_XML, "There is one file."),
}
REASONS = {"qwen2.5": "", "qwen3": THINKING, "qwen3-coder": ""}


@pytest.fixture(scope="session")
def template_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from openforge.engine.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("templates")
    return {name: build_tiny_model(root / name, template=name) for name in SCRIPTS}


@pytest.fixture
def serve(store: Store) -> Iterator[Any]:
    """serve(model_path, script, **proxy_config) -> (proxy, engine, rollout)."""
    started = []

    def make(model: Path, script: list[str], **config: Any):
        engine = ScriptedEngine(model, script)
        es = serve_in_thread(engine.app)
        run = store.create_run(kind="proxy")
        rollout = store.create_rollout(run_id=run.id, task_id="t", status="running")
        proxy = ProxyServer(ProxyConfig(**config), store_path=store.path, engine_url=es.url, model_path=model).start()
        started.append((proxy, es))
        return proxy, engine, rollout

    yield make
    for proxy, es in started:
        proxy.stop()
        es.stop()


# -- each API as a harness speaks it: (thinking, text, [(name, args)]) and the replayed turn ----------


def chat(url: str, key: str, msgs: list, stream: bool) -> tuple[tuple, list]:
    c = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30)
    if not stream:
        m = c.chat.completions.create(model="m", messages=msgs, tools=CHAT_TOOLS).choices[0].message
        thinking, text = getattr(m, "reasoning_content", None) or "", m.content or ""
        calls = [(t.id, t.function.name, t.function.arguments) for t in m.tool_calls or []]
    else:
        thinking, text, parts = "", "", {}
        for ch in c.chat.completions.create(model="m", messages=msgs, tools=CHAT_TOOLS, stream=True):
            d = ch.choices[0].delta if ch.choices else None
            if d is None:
                continue
            thinking += getattr(d, "reasoning_content", None) or ""
            text += d.content or ""
            for t in d.tool_calls or []:
                have = parts.setdefault(t.index, [t.id, t.function.name, ""])
                have[2] += t.function.arguments or ""
        calls = [tuple(v) for _, v in sorted(parts.items())]
    replay = {"role": "assistant", "content": text or None,
              "tool_calls": [{"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in calls]}
    if thinking:
        replay["reasoning_content"] = thinking
    results = [{"role": "tool", "tool_call_id": i, "content": "a.txt"} for i, _, _ in calls]
    return (thinking, text, [(n, _args(a)) for _, n, a in calls]), [replay, *results]


def responses(url: str, key: str, msgs: list, stream: bool) -> tuple[tuple, list]:
    c = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30)
    if not stream:
        output = c.responses.create(model="m", input=msgs, tools=RESPONSES_TOOLS).output
    else:
        deltas: dict[str, str] = {}
        output = None
        for ev in c.responses.create(model="m", input=msgs, tools=RESPONSES_TOOLS, stream=True):
            if ev.type in ("response.reasoning_text.delta", "response.function_call_arguments.delta"):
                deltas[ev.item_id] = deltas.get(ev.item_id, "") + ev.delta
            if ev.type == "response.completed":
                output = ev.response.output
        for item in output:  # what streamed is what completed
            if item.type == "function_call":
                assert deltas[item.id] == item.arguments
            if item.type == "reasoning":
                assert deltas[item.id] == item.content[0].text
    thinking = "".join(p.text for i in output if i.type == "reasoning" for p in i.content or [])
    text = "".join(p.text for i in output if i.type == "message" for p in i.content)
    calls = [i for i in output if i.type == "function_call"]
    replay = [i.model_dump(exclude_none=True) for i in output]
    replay += [{"type": "function_call_output", "call_id": i.call_id, "output": "a.txt"} for i in calls]
    return (thinking, text, [(i.name, _args(i.arguments)) for i in calls]), replay


def messages(url: str, key: str, msgs: list, stream: bool) -> tuple[tuple, list]:
    c = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=30)
    kw = dict(model="claude-x", max_tokens=200, messages=msgs, tools=ANTHROPIC_TOOLS)
    if not stream:
        msg = c.messages.create(**kw)
    else:
        with c.messages.stream(**kw) as s:
            kinds = [ev.type for ev in s]
            msg = s.get_final_message()
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    thinking = "".join(b.thinking for b in msg.content if b.type == "thinking")
    assert all(b.signature for b in msg.content if b.type == "thinking")
    text = "".join(b.text for b in msg.content if b.type == "text")
    uses = [b for b in msg.content if b.type == "tool_use"]
    replay = [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]}]
    if uses:
        replay.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id, "content": "a.txt"}
                                                   for b in uses]})
    return (thinking, text, [(b.name, b.input) for b in uses]), replay


APIS = {"chat": chat, "responses": responses, "anthropic": messages}


def _args(text: str) -> Any:
    """Arguments as the client gets them: JSON, or the raw text of a call that broke mid-stream."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def first_turn(api: str) -> list:
    return [{"role": "user", "content": "list the files"}]  # the same shape in all three APIs


@pytest.mark.parametrize("api", list(APIS))
@pytest.mark.parametrize("template", list(SCRIPTS))
def test_each_template_through_each_api(template_models, serve, store, template, api):
    call_turn, answer = SCRIPTS[template]
    proxy, engine, rollout = serve(template_models[template], [call_turn, call_turn, answer])
    speak = APIS[api]
    msgs = first_turn(api)
    plain, _ = speak(proxy.url, rollout.key, msgs, False)
    streamed, replay = speak(proxy.url, rollout.key, msgs, True)
    assert plain == streamed == (REASONS[template], "Let me look.", [("bash", {"command": "ls"})])

    if template == "qwen3":  # the thinking's tokens are counted where the API has a field for them
        used = store.list_calls(rollout_id=rollout.id)[0]
        thinking_ids = used.completion_ids[:used.completion_ids.index(engine.tokenizer.convert_tokens_to_ids(
            "</think>")) + 1]
        details = used.response_json.get("usage", {})
        got = (details.get("completion_tokens_details") or details.get("output_tokens_details") or {}).get(
            "reasoning_tokens")
        assert got == (len(thinking_ids) if api != "anthropic" else None)
    final, _ = speak(proxy.url, rollout.key, msgs + replay, False)
    assert final[1] == "There is one file." and final[0] == ("One file." if template == "qwen3" else "")
    calls = store.list_calls(rollout_id=rollout.id)
    assert [c.status for c in calls] == ["ok"] * 3
    # The thinking and the call are sampled tokens, recorded exactly; the replay extends them.
    tok = engine.tokenizer
    assert tok.decode(calls[1].completion_ids, skip_special_tokens=True) == call_turn
    p1, c1, p2 = calls[1].prompt_ids, calls[1].completion_ids, calls[2].prompt_ids
    assert p2[:len(p1) + len(c1)] == p1 + c1 and calls[2].reused_tokens == len(c1)
    assert calls[2].break_reason is None


def test_thinking_sent_back_keeps_one_segment_and_dropped_is_recorded(template_models, serve, store):
    """Claude Code keeps thinking blocks inside a tool loop; a harness that strips them breaks the
    prefix (Qwen3's template renders the thinking of the current turn) and the call says why."""
    call_turn, answer = SCRIPTS["qwen3"]
    proxy, engine, rollout = serve(template_models["qwen3"], [call_turn, answer, answer, answer])
    msgs = first_turn("anthropic")
    _, replay = messages(proxy.url, rollout.key, msgs, False)
    _, final = messages(proxy.url, rollout.key, msgs + replay, False)
    assert store.list_calls(rollout_id=rollout.id)[1].break_reason is None
    stats = assemble_rollout(store, rollout.id)
    assert stats["n_segments"] == 1
    traj = store.list_trajectories(rollout_ids=[rollout.id])[0]
    calls = store.list_calls(rollout_id=rollout.id)
    sampled = [t for t, m in zip(traj.token_ids, traj.loss_mask) if m]
    assert sampled == calls[0].completion_ids + calls[1].completion_ids  # the thinking tokens are trained on
    think_id = engine.tokenizer.convert_tokens_to_ids("<think>")
    assert think_id in calls[0].completion_ids

    stripped = [{**replay[0], "content": [b for b in replay[0]["content"] if b["type"] != "thinking"]}, replay[1]]
    messages(proxy.url, rollout.key, msgs + stripped, False)
    third = store.list_calls(rollout_id=rollout.id)[2]
    assert third.break_reason == THINKING_DROPPED and third.reused_tokens == 0
    assert assemble_rollout(store, rollout.id)["n_segments"] == 2

    # A new user turn: Qwen3's template drops the thinking of turns before the latest user message, so
    # the history no longer renders as it was sampled; the break is the template's, and says so.
    messages(proxy.url, rollout.key, msgs + replay + final + [{"role": "user", "content": "and now?"}], False)
    fourth = store.list_calls(rollout_id=rollout.id)[3]
    assert fourth.reused_tokens == 0 and "chat template renders the replayed history differently" in \
        fourth.break_reason


def test_a_template_without_thinking_still_trains_on_the_sampled_thinking(tiny_model, serve, store):
    """The tiny template renders no thinking: the replay (with or without it) matches the recorded
    turn, and the spliced ids are the sampled ones, thinking included."""
    turn = f"<think>\n{THINKING}\n</think>\n\nLet me look.\n" + CALL_JSON
    proxy, engine, rollout = serve(tiny_model, [turn, "Done."], reasoning_parser="qwen3")
    msgs = first_turn("anthropic")
    (thinking, text, _), replay = messages(proxy.url, rollout.key, msgs, False)
    assert thinking == THINKING and text == "Let me look."
    stripped = [{**replay[0], "content": [b for b in replay[0]["content"] if b["type"] != "thinking"]}, replay[1]]
    messages(proxy.url, rollout.key, msgs + stripped, False)
    first, second = store.list_calls(rollout_id=rollout.id)
    assert second.prompt_ids[:len(first.prompt_ids) + len(first.completion_ids)] == \
        first.prompt_ids + first.completion_ids
    assert engine.tokenizer.decode(first.completion_ids, skip_special_tokens=True) == turn


def test_tool_choice_through_the_apis(tiny_model, serve, store):
    proxy, engine, rollout = serve(tiny_model, [CALL_JSON, CALL_JSON])
    c = openai.OpenAI(base_url=proxy.url + "/v1", api_key=rollout.key, max_retries=0, timeout=30)
    none = c.chat.completions.create(model="m", messages=first_turn("chat"), tools=CHAT_TOOLS, tool_choice="none")
    assert none.choices[0].message.tool_calls is None and none.choices[0].message.content == CALL_JSON
    a = anthropic.Anthropic(base_url=proxy.url, api_key=rollout.key, max_retries=0, timeout=30)
    tools = ANTHROPIC_TOOLS + [{"name": "edit", "description": "", "input_schema": {"type": "object"}}]
    named = a.messages.create(model="x", max_tokens=100, messages=first_turn("anthropic"), tools=tools,
                              tool_choice={"type": "tool", "name": "edit"})
    assert [b.type for b in named.content] == ["text"] and named.stop_reason == "end_turn"
    calls = store.list_calls(rollout_id=rollout.id)
    assert calls[0].tool_parse_error is False and calls[1].tool_parse_error is True
    # tool_choice none also hides the tools from the template: the prompt has no tool section.
    prompts = [engine.tokenizer.decode(c.prompt_ids) for c in calls]
    assert "<tools>" not in prompts[0] and "<tools>" in prompts[1]


def test_strict_parser_refuses_a_tool_never_offered(tiny_model, serve, store):
    rogue = '<tool_call>\n{"name": "rm", "arguments": {"path": "/"}}\n</tool_call>'
    proxy, _, rollout = serve(tiny_model, [rogue, rogue], tool_parser_strict=True)
    c = openai.OpenAI(base_url=proxy.url + "/v1", api_key=rollout.key, max_retries=0, timeout=30)
    out = c.chat.completions.create(model="m", messages=first_turn("chat"), tools=CHAT_TOOLS)
    assert out.choices[0].message.tool_calls is None and out.choices[0].message.content == rogue
    chunks = list(c.chat.completions.create(model="m", messages=first_turn("chat"), tools=CHAT_TOOLS, stream=True))
    assert not any(ch.choices and ch.choices[0].delta.tool_calls for ch in chunks)
    assert [c.tool_parse_error for c in store.list_calls(rollout_id=rollout.id)] == [True, True]


@pytest.mark.parametrize("template", list(SCRIPTS))
def test_strict_parsers_read_each_family_the_same(template_models, serve, store, template):
    """The families' own outputs are canonical: the SGLang-strict parsers read them as the lenient ones do."""
    call_turn, _ = SCRIPTS[template]
    proxy, _, rollout = serve(template_models[template], [call_turn, call_turn], tool_parser_strict=True)
    msgs = first_turn("chat")
    assert chat(proxy.url, rollout.key, msgs, True)[0] == chat(proxy.url, rollout.key, msgs, False)[0] == \
        (REASONS[template], "Let me look.", [("bash", {"command": "ls"})])


@pytest.mark.parametrize("api", list(APIS))
def test_a_call_that_breaks_after_its_name_streamed_ends_the_stream_cleanly(tiny_model, serve, store, api):
    """Its name and first arguments were already sent: the stream closes the call as it stands, the
    raw text follows; the recorded completion holds it as text, flagged."""
    broken = 'Trying.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la /tmp'
    proxy, engine, rollout = serve(tiny_model, [broken])
    (_, text, calls), _ = APIS[api](proxy.url, rollout.key, first_turn(api), True)
    assert [name for name, _ in calls] == ["bash"]  # announced before it broke, closed as it stood
    assert broken.split("<tool_call>")[1] in text
    (call,) = store.list_calls(rollout_id=rollout.id)
    assert call.status == "ok" and call.tool_parse_error and call.tool_calls_json is None
    assert engine.tokenizer.decode(call.completion_ids, skip_special_tokens=True) == broken



def test_a_template_that_opens_thinking_itself(template_models, serve, store, tmp_path):
    """Qwen3-2507 Thinking's template ends the generation prompt with `<think>\\n`: the answer starts
    inside the thinking and only closes it. The proxy reads that off the prompt."""
    from transformers import AutoTokenizer

    model = tmp_path / "qwen3-thinking"
    tok = AutoTokenizer.from_pretrained(str(template_models["qwen3"]))
    opening = "{{- '<|im_start|>assistant\\n' }}\n    {%- if enable_thinking"
    assert tok.chat_template.count(opening) == 1
    tok.chat_template = tok.chat_template.replace(opening, opening.replace("assistant\\n", "assistant\\n<think>\\n"))
    shutil.copytree(template_models["qwen3"], model)
    tok.save_pretrained(str(model))
    proxy, engine, rollout = serve(model, ["Plan: list.\n</think>\n\nLet me look.\n" + CALL_JSON, "Done."])
    (thinking, text, calls), replay = messages(proxy.url, rollout.key, first_turn("anthropic"), True)
    assert (thinking, text, calls) == ("Plan: list.", "Let me look.", [("bash", {"command": "ls"})])
    messages(proxy.url, rollout.key, first_turn("anthropic") + replay, False)
    first, second = store.list_calls(rollout_id=rollout.id)
    assert engine.tokenizer.decode(first.prompt_ids).endswith("<|im_start|>assistant\n<think>\n")
    assert second.prompt_ids[:len(first.prompt_ids) + len(first.completion_ids)] == \
        first.prompt_ids + first.completion_ids and second.break_reason is None


def test_responses_reads_thinking_back_from_encrypted_content_it_wrote(template_models, serve, store):
    """Codex asks for `reasoning.encrypted_content` and may replay only that: the proxy's own (marked)
    is read back; another API's opaque blob is not mistaken for thinking."""
    call_turn, answer = SCRIPTS["qwen3"]
    proxy, _, rollout = serve(template_models["qwen3"], [call_turn, answer, answer])
    msgs = first_turn("responses")
    _, replay = responses(proxy.url, rollout.key, msgs, False)
    only_sealed = [{k: v for k, v in i.items() if k != "content"} if i["type"] == "reasoning" else i for i in replay]
    responses(proxy.url, rollout.key, msgs + only_sealed, False)
    foreign = [{**i, "encrypted_content": "gAAAAB-opaque"} if i["type"] == "reasoning" else i for i in only_sealed]
    responses(proxy.url, rollout.key, msgs + foreign, False)
    _, second, third = store.list_calls(rollout_id=rollout.id)
    assert second.break_reason is None and second.reused_tokens > 0
    assert third.break_reason == THINKING_DROPPED


@pytest.mark.parametrize("template", ["qwen3", "qwen3-coder"])
def test_after_a_proxy_restart_the_recorded_turns_are_parsed_again_the_same(template_models, store, template):
    """A restarted proxy relearns a rollout's turns from the store: it re-parses the recorded completion
    with the same parsers (thinking, XML calls), so the replay still splices."""
    call_turn, answer = SCRIPTS[template]
    engine = ScriptedEngine(template_models[template], [call_turn, answer])
    run = store.create_run(kind="proxy")
    rollout = store.create_rollout(run_id=run.id, task_id="t", status="running")
    with serve_in_thread(engine.app) as es:
        def proxy() -> ProxyServer:
            return ProxyServer(ProxyConfig(), store_path=store.path, engine_url=es.url,
                               model_path=template_models[template]).start()
        first = proxy()
        try:
            _, replay = messages(first.url, rollout.key, first_turn("anthropic"), True)
        finally:
            first.stop()
        second = proxy()
        try:
            messages(second.url, rollout.key, first_turn("anthropic") + replay, False)
        finally:
            second.stop()
    one, two = store.list_calls(rollout_id=rollout.id)
    assert two.break_reason is None and two.reused_tokens == len(one.completion_ids)
