"""The real Claude Code with thinking on, through the real proxy and runner, against the tiny model with
Qwen3's chat template (issue 47).

Claude Code 2.1 thinks by default (`thinking: {"type": "adaptive"}` on every call; MAX_THINKING_TOKENS=0
or the setting `alwaysThinkingEnabled: false` turn it off). The policy thinks before its tool call and
before its answer; the proxy returns each <think> part as a thinking block with a signature, and the
store shows what Claude Code sent back in the next turn (all of it: one segment, no break), and that
every sampled token, thinking included, trains exactly once. docs/harnesses.md, "Claude Code 2.1:
thinking", has the requests as captured. Skipped where the CLI is not installed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from openforge.config import ForgeConfig, HarnessConfig
from openforge.proxy import breaks
from openforge.proxy.anthropic import signature
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import TaskSpec
from openforge.sandbox.testing import proxy_socket_path
from tests.helpers.harnesses import ANSWER, COMMAND, MARK, needs, NPM_CACHE
from tests.helpers.proxy_rig import make_rig  # noqa: F401 - fixture
from tests.proxy.test_stripped_thinking import trained_and_sampled

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

# What the policy thinks before each of its three answers: a look, the write, the answer.
THOUGHTS = ["First see what is here.", "Nothing yet: write the file.", "The tool ran, the file is written."]
LOOKED = "FORGE_LOOKED"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with Qwen3's chat template (overrides the session's; make_rig serves this one)."""
    from openforge.engine.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen3") / "tiny", template="qwen3")


def bash(command: str) -> str:
    call = {"name": "Bash", "arguments": {"command": command, "description": "run"}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


async def one_rollout(rig: Any) -> Any:
    """One rollout of a write-a-file task through the real Claude Code (`--bare --tools Bash`) and the runner."""
    config = ForgeConfig()
    config.harness = HarnessConfig(name="claude-code", npm_cache=str(NPM_CACHE), max_turns=6,
                                   extra_args=["--bare", "--tools", "Bash"])
    task = TaskSpec(id="think", instruction="Write forge-ok into proof.txt.", verifier="grep -qx forge-ok proof.txt")
    runner = RolloutRunner(rig.store, config=config, proxy_url=rig.url, proxy_socket=rig.proxy.uds)
    [ro] = await runner.run(rig.rollout.run_id, [RolloutSpec(task, 0)])
    return ro


@needs("claude-code")
async def test_claude_code_with_thinking_replays_it_and_trains_each_sampled_token_once(make_rig: Any) -> None:
    """Claude Code (`--bare --tools Bash`, a 1.4k-token first prompt, its default thinking) runs a look,
    a write and an answer; each answer opens with the policy's <think> part."""
    rig = make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=400_000)
    tok = rig.engine.tokenizer

    def script(prompt_ids: list[int]) -> str:
        text = tok.decode(prompt_ids)
        turn = 2 if MARK in text else 1 if LOOKED in text else 0
        answer = [bash("ls; printf 'FORGE_%s\\n' LOOKED"), bash(COMMAND), ANSWER][turn]
        return f"<think>\n{THOUGHTS[turn]}\n</think>\n\n{answer}"

    rig.engine.script = script
    ro = await one_rollout(rig)
    assert (ro.status, ro.reward) == ("scored", 1.0), (ro.error, ro.stdout[-1500:])

    trained, sampled, calls = trained_and_sampled(rig, ro.id)
    assert len(calls) == 3
    for i, call in enumerate(calls):
        req, resp = call.request_json, call.response_json
        assert req["thinking"] == {"type": "adaptive"} and req["stream"] is True
        # The <think> part comes back as a signed thinking block, under the model the request named:
        # Claude Code strips signed thinking from turns another model answered.
        assert resp["content"][0] == {"type": "thinking", "thinking": THOUGHTS[i], "signature": signature(THOUGHTS[i])}
        assert resp["model"] == req["model"]
        # Claude Code sends every earlier answer back whole, its thinking block and signature included.
        replayed = [m["content"] for m in req["messages"] if m["role"] == "assistant"]
        assert replayed == [c.response_json["content"] for c in calls[:i]]
    # Qwen3's template keeps the thinking of the turns after the last user message (the whole tool loop of a
    # `claude -p` run), so each call extends the last one: one segment, the sampled ids spliced in.
    assert [c.break_reason for c in calls] == [None, None, None]
    assert (ro.n_segments, ro.n_extends) == (1, 2)
    # every earlier answer's sampled ids (its thinking included) reused, none re-tokenised
    assert [c.reused_tokens for c in calls] == [sum(len(c.completion_ids) for c in calls[:i]) for i in range(3)]
    assert all(t in tok.decode(calls[-1].prompt_ids) for t in THOUGHTS[:2])
    assert trained == sampled  # every sampled token, thinking included, trained once and where it was sampled


@needs("claude-code")
async def test_an_answer_that_is_only_thinking_is_retried_and_trains_once(make_rig: Any) -> None:
    """Bad input: the policy thinks and says nothing. Claude Code takes it for an empty answer and resends
    the last user turn with text appended; the proxy labels that `retried`, the rollout is the policy's
    (scored, reward 0), and both answers' tokens train once."""
    rig = make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=400_000)
    rig.engine.script = lambda prompt_ids: "<think>\nOnly thinking, no answer.\n</think>\n\n"
    ro = await one_rollout(rig)
    assert (ro.status, ro.reward) == ("scored", 0.0), (ro.error, ro.stdout[-1500:])
    trained, sampled, calls = trained_and_sampled(rig, ro.id)
    assert [c.response_json["content"][0]["type"] for c in calls] == ["thinking"] * len(calls)
    assert calls[0].break_reason is None and len(calls) >= 2
    assert {c.break_reason for c in calls[1:]} == {breaks.RETRIED}
    assert trained == sampled
