"""Thinking through a Qwen3-style template (issue 47): a harness that drops earlier turns' thinking when it
replays the conversation, and one that sends it back. Either way each turn's thinking is trained where it
was sampled and nothing twice (trained tokens = sampled tokens); where the harness dropped it, the break
is named `thinking dropped` and the turn starts a segment of its own, sharing the rollout's reward.

The chat is the official `openai` SDK against the real proxy; the engine answers from a script in the
text a Qwen3 model writes (its <think> block first), through the tiny model's tokenizer with Qwen3's
chat template (engine/templates/qwen3.jinja)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from openforge.proxy.breaks import THINKING_DROPPED
from openforge.rollouts.runner.trajectory import assemble_rollout
from tests.helpers.proxy_rig import CHAT_TOOLS, make_rig  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(90)

TURNS = ['<think>\nThe files first.\n</think>\n\nLet me look.\n<tool_call>\n'
         '{"name":"bash","arguments":{"command":"ls"}}\n</tool_call>',
         '<think>\nNow count the lines.\n</think>\n\nCounting.\n<tool_call>\n'
         '{"name":"bash","arguments":{"command":"wc -l a.txt"}}\n</tool_call>',
         '<think>\nThree lines, done.\n</think>\n\na.txt has 3 lines.']
RESULTS = ["a.txt", "3 a.txt"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with Qwen3's chat template (overrides the session's; make_rig serves this one)."""
    from openforge.engine.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen3") / "tiny", template="qwen3")


def agent(rig: Any, *, send_thinking_back: bool) -> list[Any]:
    """A tool loop as a harness runs it; `send_thinking_back` False replays each answer without its thinking."""
    client = openai.OpenAI(base_url=rig.url + "/v1", api_key=rig.key, max_retries=0, timeout=30)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "How many lines has the file here?"}]
    replies = []
    for result in [*RESULTS, None]:
        reply = client.chat.completions.create(model="policy", messages=messages, tools=CHAT_TOOLS)
        message = reply.choices[0].message
        replies.append(message)
        if result is None:
            break
        said = message.model_dump(exclude_none=True)
        if not send_thinking_back:
            said.pop("reasoning_content", None)
        messages += [said, {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": result}]
    return replies


def trained_and_sampled(rig: Any, rollout_id: str | None = None) -> tuple[list[int], list[int], list[Any]]:
    """The tokens the trajectories train (loss mask on), the tokens the calls sampled, and the calls, in
    call order; of the rig's rollout, or of `rollout_id` (one the runner started)."""
    rollout_id = rollout_id or rig.rollout.id
    calls = sorted((c for c in rig.calls(rollout_id) if c.status == "ok"), key=lambda c: c.seq)
    sampled = [t for c in calls for t in c.completion_ids]
    trajectories = rig.store.list_trajectories(rollout_ids=[rollout_id])
    trained = [t for tr in trajectories for t, m in zip(tr.token_ids, tr.loss_mask) if m]
    return trained, sampled, calls


def test_a_harness_that_drops_earlier_thinking_trains_each_turns_thinking_once(make_rig: Any) -> None:
    rig = make_rig(list(TURNS))
    replies = agent(rig, send_thinking_back=False)
    assert [r.reasoning_content for r in replies] == ["The files first.", "Now count the lines.", "Three lines, done."]
    assert replies[-1].content == "a.txt has 3 lines."
    stats = assemble_rollout(rig.store, rig.rollout.id)
    trained, sampled, calls = trained_and_sampled(rig)
    assert [c.break_reason for c in calls] == [None, THINKING_DROPPED, THINKING_DROPPED]
    assert stats["n_segments"] == 3  # a turn whose thinking was dropped starts a segment; the reward is the rollout's
    assert trained == sampled  # every sampled token, thinking included, trained once and where it was sampled
    tok = rig.engine.tokenizer
    for call in calls:  # each segment's prompt is what the engine was given: the earlier thinking is not in it
        assert "The files first." not in tok.decode(call.prompt_ids) or call.seq == 0
        assert "<think>" in tok.decode(call.completion_ids)


def test_a_harness_that_sends_thinking_back_is_one_segment(make_rig: Any) -> None:
    rig = make_rig(list(TURNS))
    agent(rig, send_thinking_back=True)
    stats = assemble_rollout(rig.store, rig.rollout.id)
    trained, sampled, calls = trained_and_sampled(rig)
    assert [c.break_reason for c in calls] == [None, None, None]
    assert stats["n_segments"] == 1 and stats["n_extends"] == 2
    assert trained == sampled
    assert calls[1].reused_tokens == len(calls[0].completion_ids)  # the sampled thinking reused, not re-tokenised
