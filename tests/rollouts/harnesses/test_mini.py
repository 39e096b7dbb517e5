"""The `mini` harness end to end: ScriptedEngine -> real proxy (ProxyServer, loopback) -> mini agent in
a real local sandbox -> verifier; and its robustness to the nonsense a random policy emits."""

from __future__ import annotations

from pathlib import Path

import pytest

from openforge.engine.scripted import ScriptedEngine
from openforge.config import ForgeConfig
from openforge.store import Store
from openforge.proxy.server import ProxyServer
from openforge.rollouts.harnesses import get_harness
from openforge.rollouts.harnesses.mini_agent import run_tool
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import TaskSpec, load_tasks
from tests.helpers.mini import serve  # noqa: F401 - fixtures

WRITE_HELLO = ('<tool_call>\n{"name": "write_file", "arguments": {"path": "hello.txt", '
               '"content": "hello world\\n"}}\n</tool_call>')


def _run(store: Store, proxy: ProxyServer, task: TaskSpec, *, max_turns: int = 8):  # noqa: ANN202
    import asyncio

    cfg = ForgeConfig()
    cfg.harness.max_turns = max_turns
    run = store.create_run(kind="eval")
    runner = RolloutRunner(store, config=cfg, proxy_url=proxy.url, proxy_socket=proxy.uds)
    [ro] = asyncio.run(runner.run(run.id, [RolloutSpec(task)]))
    return ro


def test_mini_solves_a_task_through_the_proxy_in_a_sandbox(serve, store: Store) -> None:  # noqa: ANN001
    proxy, engine = serve([WRITE_HELLO, "Done: hello world"])
    task = next(t for t in load_tasks("builtin") if t.id == "med-create-file")
    ro = _run(store, proxy, task)
    assert (ro.status, ro.reward, ro.exit_code, ro.harness) == ("scored", 1.0, 0, "mini"), (ro.error, ro.stderr)
    assert "write_file -> 'wrote 12 characters" in ro.stdout
    calls = store.list_calls(rollout_id=ro.id)
    assert [c.status for c in calls] == ["ok", "ok"] and [c.api for c in calls] == ["openai_chat"] * 2
    assert calls[0].tool_calls_json[0]["name"] == "write_file"
    # the second call's request carries the tool result the agent produced in the sandbox
    second = calls[1].request_json
    assert second["messages"][-1]["role"] == "tool" and "wrote 12 characters" in second["messages"][-1]["content"]
    assert len(engine.requests) == 2
    [traj] = store.list_trajectories(rollout_ids=[ro.id])
    mask = traj.loss_mask
    assert ro.n_calls == 2 and traj.n_tokens == len(traj.token_ids) == len(mask) and 0 < sum(mask) < len(mask)


def test_mini_survives_a_random_policy(serve, store: Store) -> None:  # noqa: ANN001
    garbage = [
        '<tool_call>\n{"name": "launch_rockets", "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "bash", "arguments": {"command": 42}}\n</tool_call>',
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "no/such/file"}}\n</tool_call>',
        '<tool_call>\n{"name": "write_file", "arguments": {"path": "/proc/1/nope", "content": "x"}}\n</tool_call>',
        'the cat <tool_call>\n{"name": bash broken json\n</tool_call> yes yes',
    ]
    proxy, _ = serve(garbage)
    task = TaskSpec(id="junk", instruction="anything", verifier="cat .forge/answer.txt")
    ro = _run(store, proxy, task)
    assert (ro.status, ro.exit_code) == ("scored", 0), (ro.error, ro.stderr)
    assert "unknown tool 'launch_rockets'" in ro.stdout and "must be a string" in ro.stdout
    assert "the cat" in ro.verifier_output  # the unparsed text came back as the final answer
    assert len(store.list_calls(rollout_id=ro.id)) == 5


def test_mini_stops_at_max_turns_and_still_answers(serve, store: Store) -> None:  # noqa: ANN001
    proxy, _ = serve(lambda ids: '<tool_call>\n{"name": "bash", "arguments": {"command": "echo hi"}}\n</tool_call>')
    task = TaskSpec(id="loop", instruction="loop", verifier="test -f .forge/answer.txt")
    ro = _run(store, proxy, task, max_turns=3)
    assert (ro.status, ro.reward, ro.exit_code) == ("scored", 1.0, 0)
    assert "stopped after 3 turns" in ro.stdout and len(store.list_calls(rollout_id=ro.id)) == 3


def test_a_context_the_policy_filled_scores_0_and_is_not_masked(serve, store: Store) -> None:  # noqa: ANN001
    """Issue 30: the policy's commands print until the proxy refuses the prompt as too long
    (`context_length_exceeded`): mini exits 6, the policy's failure, scored 0 (it was a masked harness
    failure). The task's verifier would pass: it is never run."""
    proxy, _ = serve(lambda ids: '<tool_call>\n{"name": "bash", "arguments": {"command": "seq 1 3000"}}\n</tool_call>',
                     max_context_tokens=2000)
    ro = _run(store, proxy, TaskSpec(id="t", instruction="x", verifier="true"))
    assert ro.exit_code == 6 and "prompt is too long" in ro.stderr, ro.stderr
    assert (ro.status, ro.reward, ro.failure_kind, ro.verifier_output) == ("scored", 0.0, "policy", None), ro.error
    assert ro.error.startswith("policy: mini stopped on the policy's failure: exit code 6"), ro.error


def test_a_folder_the_policy_left_at_the_answer_path_does_not_fail_the_harness(
        serve, store: Store) -> None:  # noqa: ANN001
    """The policy's own tool makes .forge/answer.txt a folder: the agent's final write must still land
    (the folder moved aside), so its answer is graded; the write raising made the rollout a harness
    failure, which drops its group instead of scoring it."""
    block = ('<tool_call>\n{"name": "bash", "arguments": {"command": '
             '"rm -rf .forge/answer.txt; mkdir -p .forge/answer.txt/x"}}\n</tool_call>')
    proxy, _ = serve([block, "5"])
    ro = _run(store, proxy, TaskSpec(id="four", instruction="say 4", expect_answer={"number": 4}))
    assert (ro.status, ro.reward, ro.exit_code, ro.failure_kind) == ("scored", 0.0, 0, None), (ro.error, ro.stderr)


def test_engine_failure_is_infra_not_data(serve, store: Store) -> None:  # noqa: ANN001
    proxy, engine = serve(["never used"])
    for _ in range(20):  # more than the SDK's retry and any proxy retries of the engine can use
        engine.fail_next("http_500")
    ro = _run(store, proxy, TaskSpec(id="t", instruction="x", verifier="true"))
    assert ro.exit_code == 3 and "API error" in ro.stderr
    assert ro.status == "failed" and ro.error.startswith("infra: the rollout's last model call failed")


def test_run_tool_never_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_tool("write_file", '{"path": "a/b.txt", "content": "hi"}', bash_timeout=5) == "wrote 2 characters to a/b.txt"
    assert run_tool("read_file", '{"path": "a/b.txt"}', bash_timeout=5) == "hi"
    assert run_tool("bash", '{"command": "echo out; echo err >&2; exit 3"}', bash_timeout=5) == "exit code 3\nout\nerr\n"
    assert "timed out after 0.2s" in run_tool("bash", '{"command": "sleep 5"}', bash_timeout=0.2)
    assert "JSONDecodeError" in run_tool("bash", "{nope", bash_timeout=5)
    assert "must be a JSON object" in run_tool("bash", "[1]", bash_timeout=5)
    assert "must be a string" in run_tool("read_file", '{"path": null}', bash_timeout=5)
    assert "FileNotFoundError" in run_tool("read_file", '{"path": "missing"}', bash_timeout=5)
    assert "IsADirectoryError" in run_tool("read_file", '{"path": "a"}', bash_timeout=5)
    assert "unknown tool" in run_tool("", None, bash_timeout=5)
    big = run_tool("bash", '{"command": "yes x | head -c 100000"}', bash_timeout=5)
    assert len(big) < 4200 and "characters cut" in big


def test_registry() -> None:
    from openforge.config import HarnessConfig
    from openforge.errors import HarnessError

    mini = get_harness(HarnessConfig(name="mini", max_turns=2))
    from openforge.rollouts.harnesses.base import HarnessContext

    ctx = HarnessContext(proxy_url="http://127.0.0.1:5/", api_key="k", model="m", instruction="i", workdir="/w",
                         backend="docker")
    assert mini.command(ctx)[:2] == ["python3", ".forge/mini_agent.py"] and "2" in mini.command(ctx)
    assert mini.env(ctx)["OPENAI_BASE_URL"] == "http://127.0.0.1:5/v1"
    cfg = HarnessConfig()
    object.__setattr__(cfg, "name", "nope")  # bypass the Literal, as a stale config file would
    with pytest.raises(HarnessError, match="unknown harness 'nope'"):
        get_harness(cfg)


async def test_the_python_mini_adapter_prepares_its_agent_and_reads_how_it_ended(tmp_path: Path) -> None:
    """rollouts/harnesses/mini.py (`MiniHarness`, the reference bench/ compares the spec-driven mini against)."""
    import sys

    from openforge.config import HarnessConfig, LocalSandboxConfig
    from openforge.rollouts.harnesses.base import HarnessContext
    from openforge.rollouts.harnesses.mini import AGENT_PATH, AGENT_SOURCE, INSTRUCTION_PATH, MiniHarness
    from openforge.rollouts.harnesses.mini_agent import CONTEXT_FULL
    from openforge.rollouts.tasks.format import ANSWER_FILE
    from openforge.sandbox import make_sandbox
    from openforge.sandbox.base import ExecResult

    mini = MiniHarness(HarnessConfig(max_turns=3, max_tokens=64))
    assert MiniHarness.available(ForgeConfig()) is None  # this venv has `openai`
    ctx = HarnessContext(proxy_url="http://127.0.0.1:5", api_key="k", model="m", instruction="say 'hi'\n",
                         workdir="/w", backend="local")
    assert mini.command(ctx)[:2] == [sys.executable, AGENT_PATH]
    assert mini.command(ctx)[2:8] == ["--instruction-file", INSTRUCTION_PATH, "--max-turns", "3", "--max-tokens", "64"]
    assert mini.env(ctx)["OPENAI_BASE_URL"] == "http://127.0.0.1:5/v1" and mini.env(ctx)["OPENAI_API_KEY"] == "k"
    async with make_sandbox(LocalSandboxConfig(isolation="none"), run_id="run-m", rollout_id="ro-m") as sb:
        await mini.prepare(sb, ctx)
        assert await sb.read_file(AGENT_PATH) == AGENT_SOURCE.read_bytes()
        assert await sb.read_file(INSTRUCTION_PATH) == b"say 'hi'\n"  # a file, never argv
        await sb.write_file(ANSWER_FILE, b"hi")
        assert (await mini.outcome(ExecResult(0, "", ""), sb)).answer == "hi"
        failed = await mini.outcome(ExecResult(3, "", "API error 502\n"), sb)  # the file is no answer then
        assert (failed.answer, failed.failure) == (None, "mini exited 3: API error 502")
        full = await mini.outcome(ExecResult(CONTEXT_FULL, "", ""), sb)
        assert full.failure is None and "outgrew the model's context" in full.policy_failure
