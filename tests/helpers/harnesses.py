"""Shared by the tests that run the real npm harnesses (Claude Code, Codex, OpenClaw): the npm cache they
install into, the skip when one is absent, and the scripted policy's turns and the checks of its recording."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from openforge.rollouts.harnesses import npm_harness
from openforge.rollouts.harnesses.npm import find_package_bin, install_hint
from openforge.rollouts.runner.trajectory import assemble_rollout
from tests.helpers.required import requires
from openforge.engine.protocol import BadRequest
from openforge.rollouts.tasks.format import TaskSpec


NPM_CACHE = Path(os.environ.get("FORGE_NPM_CACHE") or Path.home() / ".cache" / "openforge-npm").expanduser()
MARK = "FORGE_TOOL_RAN"
# printf splits the marker so that only the tool's *output* contains it, not the call's arguments:
# the script answers once the marker is in the prompt, i.e. once the tool result came back.
COMMAND = f"printf 'forge-ok\\n' > proof.txt && printf 'FORGE_%s\\n' TOOL_RAN"
ANSWER = "Done: proof.txt is written."


def needs(name: str) -> Any:
    """Mark a test `npm` and skip it (fail it under FORGE_REQUIRE=npm) unless harness `name` is installed
    in the npm cache."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        missing: str | None = "node/npm are not installed"
    elif find_package_bin(NPM_CACHE, name, npm_harness(name)) is None:
        missing = f"{name} is not installed in {NPM_CACHE} ({install_hint(name, NPM_CACHE, npm_harness(name))})"
    else:
        missing = None
    return lambda test: requires("npm", missing)(pytest.mark.npm(test))


def tool_then_answer(tokenizer: Any, tool: str, arguments: dict[str, Any]) -> Any:
    """A script: one `<tool_call>` of `tool` until the prompt holds the tool's output, then the answer."""
    call = f'<tool_call>\n{json.dumps({"name": tool, "arguments": arguments})}\n</tool_call>'

    def script(prompt_ids: list[int]) -> str:
        return ANSWER if MARK in tokenizer.decode(prompt_ids) else call

    return script


def check_recording(rig: Any, api: str) -> dict[str, Any]:
    """The calls are recorded as `api`, their tokens decode to what was served, and the trajectory's
    sampled tokens are exactly those completions."""
    calls = [c for c in rig.calls() if c.status == "ok"]
    assert {c.api for c in calls} == {api}
    served = rig.served_texts()
    assert served[-1] == ANSWER and any("<tool_call>" in text for text in served)
    stats = assemble_rollout(rig.store, rig.rollout.id)
    trajectories = rig.store.list_trajectories(rollout_ids=[rig.rollout.id])
    assert trajectories and sum(len(t.call_ids) for t in trajectories) == len(calls)
    tok = rig.engine.tokenizer
    sampled = [i for t in trajectories for i, m in zip(t.token_ids, t.loss_mask) if m]
    expected = [i for c in calls for i in c.completion_ids]
    assert sampled == expected
    assert tok.decode(sampled, skip_special_tokens=True) == "".join(served)
    assert stats["n_calls"] == len(calls) and stats["n_segments"] + stats["n_extends"] == len(calls)
    return stats


def check_extends(rig: Any, stats: dict[str, Any]) -> None:
    """The answer's prompt extended the tool call's prompt + completion: one segment, and the replayed
    assistant turn reused the sampled tokens (no re-tokenisation)."""
    first, second = [c for c in rig.calls() if c.status == "ok"]
    assert (stats["n_segments"], stats["n_extends"]) == (1, 1)
    assert second.reused_tokens == first.completion_tokens


SUMMARY_PROMPT = "You are performing a CONTEXT CHECKPOINT COMPACTION"  # Codex's, as captured


CARRIED = "Another language model started to solve this problem"  # how Codex replays the summary


SUMMARY = "Summary: parts 1-3 of the long file are read; next, write forge-ok into proof.txt."


TASK = TaskSpec(id="long-file", instruction="Read the long file part by part, then write forge-ok into proof.txt.",
                verifier="grep -qx forge-ok proof.txt")


def exec_call(cmd: str) -> str:
    return f'<tool_call>\n{json.dumps({"name": "exec_command", "arguments": {"cmd": cmd}})}\n</tool_call>'


def compacting_policy(tokenizer: Any, *, give_up_second: bool = True, fail_summary: bool = False) -> Any:
    """Reads parts of a long file; answers a summary request with SUMMARY; after the compaction writes
    proof.txt and says done. With `give_up_second` the second rollout of the group says it cannot
    (reward 0); with `fail_summary` every summary request is an engine error."""
    finished = 0

    def script(prompt_ids: list[int]) -> str:
        nonlocal finished
        text = tokenizer.decode(prompt_ids)
        last_turn = text[text.rindex("<|im_start|>user"):] if "<|im_start|>user" in text else ""
        if SUMMARY_PROMPT in last_turn:
            if fail_summary:
                raise BadRequest("engine down during the summary", 500)
            return SUMMARY
        if CARRIED not in text:
            return exec_call(f"seq -f 'line %g of part {text.count('Process exited') + 1} of the long file' 1 150")
        if finished and give_up_second:
            return "I could not finish."
        if MARK not in text:
            return exec_call(COMMAND)
        finished += 1
        return "Done: proof.txt is written."

    return script
