"""The proxy through the official `openai` SDK's Responses API (what Codex speaks), over loopback."""

from __future__ import annotations

import json

import openai
import pytest

from openforge.rollouts.runner.trajectory import assemble_rollout
from tests.helpers.proxy_rig import RESPONSES_TOOLS, TOOL_TURN, make_rig  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(60)


def test_function_call_loop_streaming_and_not(make_rig):
    rig = make_rig([TOOL_TURN, "Found a.txt"])
    c = openai.OpenAI(base_url=rig.url + "/v1", api_key=rig.key, max_retries=0, timeout=20)
    items = [{"role": "user", "content": [{"type": "input_text", "text": "list files"}]}]
    with c.responses.stream(model="codex", instructions="Be brief.", input=items, tools=RESPONSES_TOOLS) as s:
        kinds = [ev.type for ev in s]
        first = s.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    for kind in ("response.output_item.added", "response.output_text.delta",
                 "response.function_call_arguments.delta", "response.output_item.done"):
        assert kind in kinds
    message, call = first.output
    assert message.type == "message" and message.content[0].text == "Let me look."
    assert call.type == "function_call" and call.name == "bash" and json.loads(call.arguments) == {"command": "ls"}
    # Codex replays the output items and appends the tool's output.
    items += [item.model_dump(exclude_none=True) for item in first.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "a.txt"})
    second = c.responses.create(model="codex", instructions="Be brief.", input=items, tools=RESPONSES_TOOLS)
    assert second.output_text == "Found a.txt" and second.status == "completed"
    assert second.usage.input_tokens == rig.calls()[1].prompt_tokens
    stats = assemble_rollout(rig.store, rig.rollout.id)
    assert (stats["n_segments"], stats["n_extends"]) == (1, 1)
    assert rig.calls()[1].reused_tokens > 0


def test_refusals_and_incomplete(make_rig):
    rig = make_rig(["a b c d e f g h"])
    c = openai.OpenAI(base_url=rig.url + "/v1", api_key=rig.key, max_retries=0, timeout=20)
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        c.responses.create(model="m", input="x", previous_response_id="resp_1")
    out = c.responses.create(model="m", input="x", max_output_tokens=3)
    assert out.status == "incomplete" and out.incomplete_details.reason == "max_output_tokens"
