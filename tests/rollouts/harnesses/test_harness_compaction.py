"""The real CLIs compacting their context and starting sub-agents, through the real proxy and runner
(issue 47).

Each policy reads parts of a long file until the harness compacts, writes the summary it is asked for,
then finishes; the harness's summary request is tagged (`call.side = "compaction"`) and trained with
the rollout, the prefix breaks are labelled `compaction`, and every sampled token trains exactly once.

Codex 0.171 compacts when a turn's usage passes `model_auto_compact_token_limit` (set with `-c`, beside
`model_context_window`): one request with the whole history, a summary prompt as the last user turn and
no tools, then the conversation goes on from its first turns + the summary (docs/harnesses.md,
"Compaction"). Claude Code 2.1 compacts proactively only when its auto-compact window is set
(CLAUDE_CODE_AUTO_COMPACT_WINDOW), at min(that, CLAUDE_CODE_MAX_CONTEXT_TOKENS) - 20k - 13k tokens: its
summary request forks the history (the summary prompt appended to the last user turn, tools kept), and
the conversation goes on from a first user turn that holds the summary. Skipped where the CLI is not
installed (tests/rollouts/harnesses/test_real_harnesses.py).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from openforge.config import ForgeConfig, HarnessConfig
from openforge.engine.protocol import BadRequest
from openforge.proxy import breaks
from openforge.rollouts.harnesses import BUILTIN_SPECS
from openforge.rollouts.runner.failures import is_infra_failure
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import TaskSpec
from openforge.sandbox.testing import proxy_socket_path
from openforge.trainer.data import build_batch, call_sampling
from tests.helpers.harnesses import ANSWER, COMMAND, compacting_policy, MARK, needs, NPM_CACHE, SUMMARY, SUMMARY_PROMPT, TASK
from tests.helpers.proxy_rig import make_rig  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(180)

# Usage counts the tiny tokenizer's tokens: Codex's first prompt is ~23.5k, each part read adds ~2.7k,
# so the third part's turn passes 30k and Codex compacts (a long task in a small context).
CONTEXT = ["-c", "model_context_window=34000", "-c", "model_auto_compact_token_limit=30000"]


async def run_group(rig: Any, n: int = 2, extra_args: tuple[str, ...] = ()) -> list[Any]:
    config = ForgeConfig()
    config.runner.concurrency = 1  # the script's state follows the rollouts in order
    config.harness = HarnessConfig(name="codex", npm_cache=str(NPM_CACHE), max_turns=12,
                                   extra_args=[*CONTEXT, *extra_args])
    runner = RolloutRunner(rig.store, config=config, proxy_url=rig.url, proxy_socket=rig.proxy.uds)
    return await runner.run(rig.rollout.run_id, [RolloutSpec(TASK, i) for i in range(n)])


@needs("codex")
async def test_codex_compaction_is_labelled_and_every_sampled_token_trains_once(make_rig):
    rig = make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=400_000)
    rig.engine.script = compacting_policy(rig.engine.tokenizer)
    done, gave_up = await run_group(rig)
    assert (done.status, done.reward, gave_up.status, gave_up.reward) == ("scored", 1.0, "scored", 0.0), done.error

    for ro in (done, gave_up):
        calls = [c for c in rig.calls(ro.id) if c.status == "ok"]
        summary = [c for c in calls if c.side == "compaction"]
        after = [c for c in calls if c.break_reason == breaks.COMPACTED]
        # One compaction: its summary request (the harness's own call, tagged) extends the history with
        # the tools withdrawn; the next call replays the first turns + the policy's summary.
        assert len(summary) == len(after) == 1 and summary[0].seq + 1 == after[0].seq
        assert summary[0].break_reason == breaks.SUMMARY_ASKED and summary[0].request_json["tools"] == []
        assert SUMMARY in json.dumps(after[0].request_json)
        assert {c.break_reason.split(":")[0] for c in calls if c.break_reason} == {"compaction"}
        # Three segments: before, the summary request, after; each sampled token once, in call order.
        trajectories = rig.store.list_trajectories(rollout_ids=[ro.id])
        assert len(trajectories) == ro.n_segments == 3
        sampled = [i for t in trajectories for i, m in zip(t.token_ids, t.loss_mask) if m]
        assert sampled == [i for c in sorted(calls, key=lambda c: c.seq) for i in c.completion_ids]

    # The trainer's rows: every sampled token of both rollouts exactly once, every segment of a rollout
    # with the rollout's advantage (the summary shares the reward of the work built on it).
    rollouts = [done, gave_up]
    trajectories = rig.store.list_trajectories(rollout_ids=[r.id for r in rollouts])
    batch = build_batch(rollouts, trajectories, sampling=call_sampling(rig.store, [r.id for r in rollouts]),
                        std_normalize=False)
    completions = sum(len(c.completion_ids) for r in rollouts for c in rig.calls(r.id) if c.status == "ok")
    assert sum(sum(s.loss_mask) for s in batch.samples) == completions
    assert Counter((s.rollout_id, s.advantage) for s in batch.samples) == {(done.id, 0.5): 3, (gave_up.id, -0.5): 3}


@needs("codex")
async def test_a_failed_compaction_summary_is_an_infra_failure_and_nothing_trains(make_rig):
    """The engine fails Codex's summary request; Codex (its retries off, they take ~30 s) gives up and
    exits 1. The rollout is an infrastructure failure (no reward, its group dropped), never the policy's 0."""
    rig = make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=400_000)
    rig.engine.script = compacting_policy(rig.engine.tokenizer, fail_summary=True)
    [ro] = await run_group(rig, n=1, extra_args=("-c", "model_providers.forge.request_max_retries=0",
                                                 "-c", "model_providers.forge.stream_max_retries=0"))
    assert (ro.status, ro.reward, ro.failure_kind) == ("failed", None, "infra"), (ro.status, ro.error)
    assert ro.error.endswith("HTTP 500: engine down during the summary"), ro.error
    calls = rig.calls(ro.id)
    failed = [c for c in calls if c.status != "ok"]
    assert failed and all(SUMMARY_PROMPT in json.dumps(c.request_json) for c in failed)
    assert all(c.break_reason.startswith("compaction") for c in failed if c.break_reason)
    batch = build_batch([ro], rig.store.list_trajectories(rollout_ids=[ro.id]))
    assert (batch.samples, batch.dropped_groups, batch.infra_failures) == ([], 1, 1)


CLAUDE_SUMMARY_PROMPT = "Your task is to create a detailed summary of the conversation so far"  # as captured
CLAUDE_CONTINUED = "This session is being continued from a previous conversation"


async def run_claude_compacting(rig: Any, tmp_path: Path, *, fail_summary: bool = False) -> Any:
    """Claude Code with `--bare --tools Bash` (a 1.4k-token first prompt), told its model has 48k of
    context and an auto-compact window: it compacts near 15k tokens, after the sixth part. The policy
    then writes proof.txt (after the eighth part if no compaction came). `fail_summary`: the engine
    fails every summary request, and Claude Code's own retries are off (CLAUDE_CODE_MAX_RETRIES=0)."""
    tok = rig.engine.tokenizer

    def script(prompt_ids: list[int]) -> str:
        text = tok.decode(prompt_ids)
        if CLAUDE_SUMMARY_PROMPT in text[text.rindex("<|im_start|>user"):]:
            if fail_summary:
                raise BadRequest("engine down during the summary", 500)
            return f"<analysis>six parts read</analysis>\n<summary>{SUMMARY}</summary>"
        part = text.count("line 150 of part") + 1
        if CLAUDE_CONTINUED not in text and part <= 8:
            command = f"seq -f 'line %g of part {part} of the long file' 1 150"
        elif MARK not in text:
            command = COMMAND
        else:
            return ANSWER
        call = {"name": "Bash", "arguments": {"command": command, "description": "run"}}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"

    rig.engine.script = script
    settings = 'CLAUDE_CODE_MAX_CONTEXT_TOKENS = "48000"\nCLAUDE_CODE_AUTO_COMPACT_WINDOW = "100000"\n'
    settings += 'CLAUDE_CODE_MAX_RETRIES = "0"\n' if fail_summary else ""
    spec = tmp_path / "claude-code-48k.toml"  # a user's copy of the built-in spec, with these settings
    spec.write_text((BUILTIN_SPECS / "claude-code.toml").read_text().replace(
        'IS_SANDBOX = "1"\n', 'IS_SANDBOX = "1"\n' + settings))
    config = ForgeConfig()
    config.harness = HarnessConfig(name=str(spec), npm_cache=str(NPM_CACHE), max_turns=16,
                                   extra_args=["--bare", "--tools", "Bash"])
    runner = RolloutRunner(rig.store, config=config, proxy_url=rig.url, proxy_socket=rig.proxy.uds)
    [ro] = await runner.run(rig.rollout.run_id, [RolloutSpec(TASK, 0)])
    return ro


@needs("claude-code")
async def test_claude_code_compaction_is_labelled_and_every_sampled_token_trains_once(make_rig, tmp_path):
    rig = make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=400_000)
    ro = await run_claude_compacting(rig, tmp_path)
    assert (ro.status, ro.reward) == ("scored", 1.0), (ro.error, ro.stdout[-1500:])
    assert json.loads(ro.stdout)["modelUsage"]["forge-policy"]["contextWindow"] == 48000

    calls = sorted((c for c in rig.calls(ro.id) if c.status == "ok"), key=lambda c: c.seq)
    [summary] = [c for c in calls if c.side == "compaction"]
    [after] = [c for c in calls if c.break_reason]
    # The summary request forks the history (it replays the turns before the last answer, so the proxy
    # splices it without a break); the call after it opens with the summary: labelled compaction.
    assert summary.break_reason is None and summary.request_json["tools"] == calls[0].request_json["tools"]
    assert CLAUDE_SUMMARY_PROMPT in summary.request_json["messages"][-1]["content"][-1]["text"]
    assert after.seq == summary.seq + 1 and after.break_reason == breaks.COMPACTED
    first_turn = after.request_json["messages"][0]["content"]
    assert CLAUDE_CONTINUED in json.dumps(first_turn) and SUMMARY in json.dumps(first_turn)
    trajectories = rig.store.list_trajectories(rollout_ids=[ro.id])
    assert len(trajectories) == ro.n_segments == 3  # before, the summary's fork, after
    sampled = [i for t in trajectories for i, m in zip(t.token_ids, t.loss_mask) if m]
    assert Counter(sampled) == Counter(i for c in calls for i in c.completion_ids)
    assert len(sampled) == sum(len(c.completion_ids) for c in calls)


@needs("claude-code")
async def test_a_claude_code_sub_agent_is_the_rollouts_own_segment_and_shares_its_reward(make_rig):
    """Claude Code's Agent tool (`--tools Bash,Agent`: an 8k-token first prompt) runs a sub-agent with its
    own system prompt and conversation through the same proxy, with the rollout's key. The first rollout
    delegates the file to a sub-agent (reward 1), the second gives up (reward 0)."""
    rig = make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=400_000)
    tok = rig.engine.tokenizer
    instruction, subtask = "Delegate writing the file to a sub-agent.", "SUBTASK: write forge-ok into proof.txt"
    delegated = 0

    def script(prompt_ids: list[int]) -> str:
        nonlocal delegated
        text = tok.decode(prompt_ids)
        if instruction in text:  # the main agent
            if "SUB-DONE" in text:
                return ANSWER
            if delegated:
                return "I cannot."
            delegated += 1
            call = {"name": "Agent", "arguments": {"description": "write the proof", "prompt": subtask,
                                                   "subagent_type": "general-purpose"}}
        elif MARK not in text:  # the sub-agent
            call = {"name": "Bash", "arguments": {"command": COMMAND, "description": "write"}}
        else:
            return "SUB-DONE: proof.txt is written."
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"

    rig.engine.script = script
    config = ForgeConfig()
    config.runner.concurrency = 1
    config.harness = HarnessConfig(name="claude-code", npm_cache=str(NPM_CACHE), max_turns=6,
                                   extra_args=["--tools", "Bash,Agent"])
    task = TaskSpec(id="delegate", instruction=instruction, verifier="grep -qx forge-ok proof.txt")
    runner = RolloutRunner(rig.store, config=config, proxy_url=rig.url, proxy_socket=rig.proxy.uds)
    done, gave_up = await runner.run(rig.rollout.run_id, [RolloutSpec(task, 0), RolloutSpec(task, 1)])
    assert (done.reward, gave_up.reward) == (1.0, 0.0), (done.error, gave_up.error)

    calls = sorted(rig.calls(done.id), key=lambda c: c.seq)  # every call with the rollout's key: its own
    sub = [c for c in calls if subtask in json.dumps(c.request_json["messages"][0])]
    main = [c for c in calls if c not in sub]
    assert (len(main), len(sub)) == (2, 2) and sub[0].request_json["system"] != main[0].request_json["system"]
    assert sub[0].break_reason == breaks.SUB_AGENT and not any(c.break_reason for c in calls if c is not sub[0])
    trajectories = rig.store.list_trajectories(rollout_ids=[done.id])
    assert sorted(t.call_ids for t in trajectories) == sorted([[c.id for c in main], [c.id for c in sub]])
    rollouts = [done, gave_up]
    batch = build_batch(rollouts, rig.store.list_trajectories(rollout_ids=[r.id for r in rollouts]),
                        sampling=call_sampling(rig.store, [r.id for r in rollouts]), std_normalize=False)
    completions = sum(len(c.completion_ids) for r in rollouts for c in rig.calls(r.id) if c.status == "ok")
    assert sum(sum(s.loss_mask) for s in batch.samples) == completions
    assert Counter((s.rollout_id, s.advantage) for s in batch.samples) == {(done.id, 0.5): 2, (gave_up.id, -0.5): 1}


@needs("claude-code")
async def test_a_failed_claude_code_summary_leaves_the_rollout_uncompacted_and_scored(make_rig, tmp_path):
    """The engine fails Claude Code's summary request: it goes on uncompacted (and asks again at the next
    turns, three times here), finishes, and is scored by the usual rules; the failed calls sampled
    nothing, the one segment trains each sampled token once."""
    rig = make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=400_000)
    ro = await run_claude_compacting(rig, tmp_path, fail_summary=True)
    assert (ro.status, ro.reward, ro.n_segments) == ("scored", 1.0, 1), (ro.error, ro.stdout[-1500:])
    calls = rig.calls(ro.id)
    failed = [c for c in calls if c.status != "ok"]
    assert failed and all(CLAUDE_SUMMARY_PROMPT in json.dumps(c.request_json["messages"][-1]) for c in failed)
    assert all(c.side == "compaction" for c in failed)  # the harness's own call, failed or not
    [trajectory] = rig.store.list_trajectories(rollout_ids=[ro.id])
    assert sum(trajectory.loss_mask) == sum(len(c.completion_ids) for c in calls if c.status == "ok")


@needs("claude-code")
async def test_a_sub_agent_that_never_returns_ends_at_the_time_limit_and_trains_each_token_once(make_rig):
    """The sub-agent runs a command that never ends, so the main agent never hears back: the rollout stops at
    the task's time limit (the policy's doing: a timeout, reward 0, never scored from its output), and
    what was sampled, the main agent's call and the sub-agent's, trains once, each in its own segment."""
    rig = make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=400_000)
    tok = rig.engine.tokenizer
    instruction, subtask = "Delegate writing the file to a sub-agent.", "SUBTASK: wait for the file"

    def script(prompt_ids: list[int]) -> str:
        text = tok.decode(prompt_ids)
        if instruction in text:
            call = {"name": "Agent", "arguments": {"description": "wait", "prompt": subtask,
                                                   "subagent_type": "general-purpose"}}
        else:
            call = {"name": "Bash", "arguments": {"command": "sleep 600", "description": "wait"}}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"

    rig.engine.script = script
    config = ForgeConfig()
    config.harness = HarnessConfig(name="claude-code", npm_cache=str(NPM_CACHE), max_turns=6,
                                   extra_args=["--tools", "Bash,Agent"])
    task = TaskSpec(id="never", instruction=instruction, verifier="grep -qx forge-ok proof.txt", time_limit_s=20)
    runner = RolloutRunner(rig.store, config=config, proxy_url=rig.url, proxy_socket=rig.proxy.uds)
    [ro] = await runner.run(rig.rollout.run_id, [RolloutSpec(task, 0)])
    assert (ro.status, ro.failure_kind, ro.reward) == ("timed_out", "timeout", 0.0), ro.error
    assert not is_infra_failure(ro)  # the policy's own wait: a 0 it trains on, not a masked rollout
    calls = sorted(rig.calls(ro.id), key=lambda c: c.seq)
    sub = [c for c in calls if subtask in json.dumps(c.request_json["messages"][0])]
    assert len(sub) == 1 and sub[0].break_reason == breaks.SUB_AGENT and len(calls) == 2
    sampled = sum(len(c.completion_ids) for c in calls if c.status == "ok")
    trajectories = rig.store.list_trajectories(rollout_ids=[ro.id])
    assert len(trajectories) == 2 and sum(sum(t.loss_mask) for t in trajectories) == sampled
