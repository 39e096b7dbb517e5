"""Task tools (rollouts/tasks/tools.py): a tool's declaration, each harness spec's way of taking the per-rollout
MCP server, and whole rollouts: mini (native function tools) and the real Claude Code (`--mcp-config`) in a local
sandbox on the scripted engine, where the grader reads the host's record and a record the agent forged scores 0.
(The MCP server itself, rollouts/runner/tool_server.py, is tests/rollouts/runner/test_tool_server.py's.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from openforge.config import ForgeConfig, HarnessConfig
from openforge.rollouts.harnesses import get_harness
from openforge.rollouts.harnesses.base import HarnessContext
from openforge.rollouts.harnesses.spec import HarnessSpecError, load_spec
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.runner.tool_server import dispatch_record_path
from openforge.rollouts.tasks.format import TaskSpec, validate_tasks
from openforge.rollouts.tasks.tools import TaskTool
from openforge.sandbox.testing import backend_config, proxy_socket_path, sandbox_backends
from tests.helpers.task_tools import LOOKUP, _rollout, call
from tests.helpers.required import skip_or_fail
from tests.helpers.proxy_rig import make_rig  # noqa: F401 - fixture
from tests.helpers.harnesses import NPM_CACHE, needs

# The grader: the host's record (copied in after the agent is gone) must hold a dispatch of lookup("alpha").
GRADER = ('python3 -c \'import json,os; d=[json.loads(l) for l in open(os.environ["FORGE_TOOL_DISPATCHES"])]; '
          'ok=any(x["tool"]=="lookup" and x["arguments"]=={"key":"alpha"} and x["result"].strip()=="7431" for x in d); '
          'print("score:", 1 if ok else 0)\'')
TASK = TaskSpec(id="tool-task", instruction="Look up the order alpha with the lookup tool and report its number.",
                tools=[LOOKUP], verifier=GRADER, expect_answer={"number": 7431})
FORGED = json.dumps({"seq": 0, "tool": "lookup", "arguments": {"key": "alpha"}, "result": "7431\n",
                     "is_error": False}) + "\n"


# -- the task format ------------------------------------------------------------------------------------


def test_a_tool_needs_one_handler_an_object_schema_and_a_fresh_name() -> None:
    with pytest.raises(ValueError, match="exactly one handler"):
        TaskTool(name="t", description="d")
    with pytest.raises(ValueError, match="exactly one handler"):
        TaskTool(name="t", description="d", command="true", service="svc")
    with pytest.raises(ValueError, match="type = \"object\""):
        TaskTool(name="t", description="d", command="true", input_schema={"type": "string"})
    with pytest.raises(ValueError, match="mini's own tools"):
        TaskTool(name="bash", description="d", command="true")
    with pytest.raises(ValueError, match="letters, digits"):
        TaskTool(name="a tool", description="d", command="true")
    with pytest.raises(ValueError, match="declared twice"):
        TaskSpec(id="t", instruction="x", verifier="true", tools=[LOOKUP, LOOKUP])


def test_tools_in_a_task_file_are_validated_with_a_clear_line(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text('id = "t"\ninstruction = "x"\nverifier = "true"\n[[tools]]\nname = "lookup"\n'
                    'description = "d"\nservice = "orders"\npath = "/lookup"\n')
    assert validate_tasks(good) == []
    bad = tmp_path / "bad.toml"
    bad.write_text('id = "t"\ninstruction = "x"\nverifier = "true"\n[[tools]]\nname = "lookup"\ndescription = "d"\n')
    [problem] = validate_tasks(bad)
    assert "tools.0" in str(problem) and "exactly one handler" in str(problem)


# -- the harness specs -------------------------------------------------------------------------------------


def _ctx(tools: bool) -> HarnessContext:
    return HarnessContext(proxy_url="http://127.0.0.1:8700", api_key="k", model="m", instruction="do it",
                          workdir="/sandbox/work", tools_url="http://127.0.0.1:8701/mcp" if tools else "",
                          tools_token="secret" if tools else "")


@pytest.mark.parametrize("name, marker", [
    ("claude-code", "--mcp-config"), ("codex", "mcp_servers.forge.url=http://127.0.0.1:8701/mcp"),
    ("opencode", "OPENCODE_CONFIG_CONTENT"), ("mini", "FORGE_MCP_URL")])
def test_each_harness_spec_says_how_it_takes_the_mcp_server(name: str, marker: str) -> None:
    """The [mcp] table of each spec: applied for a task with tools, absent for one without."""
    harness = get_harness(HarnessConfig(name=name))
    assert harness.takes_tools

    def given(ctx: HarnessContext) -> str:
        return " ".join(harness.command(ctx)) + " " + json.dumps(harness.env(ctx))

    assert marker in given(_ctx(True)) and marker not in given(_ctx(False))
    assert "8701" not in given(_ctx(False)) and "secret" not in given(_ctx(False))
    if name != "claude-code":  # Claude Code's URL and token are in its config file (next test)
        assert "http://127.0.0.1:8701/mcp" in given(_ctx(True)) and "secret" in given(_ctx(True))


def test_claude_codes_mcp_config_file_names_the_server_and_token() -> None:
    from openforge.rollouts.harnesses.spec import expand

    harness = get_harness(HarnessConfig(name="claude-code"))
    args = harness.command(_ctx(True))
    assert args[args.index("--mcp-config") + 1] == "/sandbox/work/.forge/mcp.json" and "--strict-mcp-config" in args
    config = json.loads(expand(harness.spec.mcp.files[".forge/mcp.json"], harness.values(_ctx(True))))
    assert config == {"mcpServers": {"forge": {"type": "http", "url": "http://127.0.0.1:8701/mcp",
                                               "headers": {"Authorization": "Bearer secret"}}}}


def test_mcp_placeholders_outside_the_mcp_table_are_refused(tmp_path: Path) -> None:
    spec = tmp_path / "h.toml"
    spec.write_text('name = "h"\n[api]\nflavour = "openai-chat"\n[run]\nprogram = "h"\nargs = ["{mcp_url}"]\n')
    with pytest.raises(HarnessSpecError, match=r"run.args\[0\]: \{mcp_url\} and \{mcp_token\} may only be used in \[mcp\]"):
        load_spec(spec)
    spec.write_text('name = "h"\n[api]\nflavour = "openai-chat"\n[run]\nprogram = "h"\n')
    assert load_spec(spec).mcp is None


# -- whole rollouts ------------------------------------------------------------------------------------------


def _answer_after_tool(tok: Any, tool: str, answer: str) -> Any:
    """Call `tool` until its result (7431) is in the prompt, then answer."""
    return lambda ids: answer if "7431" in tok.decode(ids) else call(tool, {"key": "alpha"})


async def test_mini_calls_a_task_tool_and_the_grader_reads_the_hosts_record(make_rig) -> None:  # noqa: F811
    rig = make_rig([], uds=Path(proxy_socket_path()))
    rig.engine.script = _answer_after_tool(rig.engine.tokenizer, "lookup", "7431")
    ro = await _rollout(rig, TASK, name="mini", max_turns=4)
    assert (ro.status, ro.reward) == ("scored", 1.0), (ro.error, ro.stderr, ro.stdout, ro.verifier_output)
    assert "lookup -> '7431" in ro.stdout
    [dispatch] = [json.loads(x) for x in dispatch_record_path(ro.run_id, ro.id).read_text().splitlines()]
    assert (dispatch["tool"], dispatch["arguments"], dispatch["result"].strip()) == ("lookup", {"key": "alpha"}, "7431")
    first = rig.store.list_calls(rollout_id=ro.id)[0].request_json
    assert "lookup" in [t["function"]["name"] for t in first["tools"]]  # offered as a native function tool


@pytest.mark.parametrize("backend", sandbox_backends())
async def test_the_tools_reach_mini_on_every_sandbox_backend(make_rig, backend: str) -> None:  # noqa: F811
    """bubblewrap: the socket bound in and forwarded; unisolated: the loopback port; Docker (network
    none): the socket hard-linked into a folder bound at create time, forwarded in each exec."""
    sandbox, why = backend_config(backend, image="python")  # mini needs python3 + openai
    if sandbox is None:
        skip_or_fail(backend, why)
    rig = make_rig([], uds=Path(proxy_socket_path()))
    rig.engine.script = _answer_after_tool(rig.engine.tokenizer, "lookup", "7431")
    config = ForgeConfig(sandbox=sandbox)
    config.harness = HarnessConfig(name="mini", max_turns=4)
    runner = RolloutRunner(rig.store, config=config, proxy_url=rig.url, proxy_socket=rig.proxy.uds)
    [ro] = await runner.run(rig.rollout.run_id, [RolloutSpec(TASK, 0)])
    assert (ro.status, ro.reward) == ("scored", 1.0), (ro.error, ro.stderr[-2000:], ro.stdout[-2000:])
    assert len(dispatch_record_path(ro.run_id, ro.id).read_text().splitlines()) == 1


async def test_a_dispatch_record_the_agent_forged_scores_0(make_rig) -> None:  # noqa: F811
    """The agent writes the record file itself (and, for good measure, where the grader's copy goes) and
    answers without calling the tool: the grader reads the host's empty record."""
    rig = make_rig([], uds=Path(proxy_socket_path()))
    forge_it = call("bash", {"command": f"mkdir -p .forge && printf '%s' '{FORGED.strip()}' | tee "
                                        ".forge/tool-dispatches.jsonl > tool-dispatches.jsonl && echo FORGED_OK"})
    rig.engine.script = lambda ids: "7431" if "FORGED_OK" in rig.engine.tokenizer.decode(ids) else forge_it
    ro = await _rollout(rig, TASK, name="mini", max_turns=4)
    assert (ro.status, ro.reward) == ("scored", 0.0), (ro.error, ro.stderr, ro.stdout)
    assert "score: 0" in (ro.verifier_output or "")
    assert dispatch_record_path(ro.run_id, ro.id).read_text() == ""


async def test_a_tool_that_hangs_on_the_agents_call_is_scored_not_masked(make_rig) -> None:  # noqa: F811
    """The agent sees the timeout as the tool's answer and the rollout is graded on what it then does: a
    mask here would let a policy escape any failing rollout by hanging a tool."""
    rig = make_rig([], uds=Path(proxy_socket_path()))
    hung = TaskTool(name="lookup", description="d", command="sleep 30", timeout_s=0.5)
    task = TASK.model_copy(update={"tools": [hung]})
    rig.engine.script = lambda ids: "0000" if "timed out" in rig.engine.tokenizer.decode(ids) else \
        call("lookup", {"key": "alpha"})
    ro = await _rollout(rig, task, name="mini", max_turns=4)
    assert (ro.status, ro.reward) == ("scored", 0.0), (ro.error, ro.stdout)
    [dispatch] = [json.loads(x) for x in dispatch_record_path(ro.run_id, ro.id).read_text().splitlines()]
    assert (dispatch["infra_error"], dispatch["failure"]) == (None, "tool lookup: its command ran past 0.5s")


@pytest.mark.slow
@pytest.mark.timeout(300)
@needs("claude-code")
async def test_claude_code_calls_a_task_tool_over_mcp(make_rig) -> None:  # noqa: F811
    """The real Claude Code in a local sandbox takes the server from --mcp-config and calls the tool as
    mcp__forge__lookup; the record is the host's, and the task scores."""
    rig = make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=400_000)
    rig.engine.script = _answer_after_tool(rig.engine.tokenizer, "mcp__forge__lookup", "7431")
    ro = await _rollout(rig, TASK, name="claude-code", npm_cache=str(NPM_CACHE), max_turns=4,
                        extra_args=["--bare", "--tools", "Bash"])
    assert (ro.status, ro.reward) == ("scored", 1.0), (ro.error, ro.stderr[-3000:], ro.stdout[-3000:],
                                                       ro.verifier_output)
    [dispatch] = [json.loads(x) for x in dispatch_record_path(ro.run_id, ro.id).read_text().splitlines()]
    assert (dispatch["tool"], dispatch["arguments"]) == ("lookup", {"key": "alpha"})
    first = rig.store.list_calls(rollout_id=ro.id)[0].request_json
    assert "mcp__forge__lookup" in [t["name"] for t in first["tools"]]


def _answer_after_mcp_tool(tok: Any, offered: list[str]) -> Any:
    """Call the lookup tool under whatever name the harness gave it (found in the rendered prompt's tool
    list: mcp__forge__lookup, forge__lookup, forge_lookup, ...) until its result is in the prompt, then answer."""
    import re

    def script(ids: list[int]) -> str:
        prompt = tok.decode(ids)
        if "7431" in prompt:
            return "7431"
        names = re.findall(r'"name":\s*"([A-Za-z0-9_.-]*lookup)"', prompt)
        offered.extend(n for n in names if n not in offered)
        return call(names[0] if names else "no-lookup-tool-offered", {"key": "alpha"})

    return script


async def _mcp_rollout(rig: Any, name: str, tool_name: str) -> None:
    offered: list[str] = []
    rig.engine.script = _answer_after_mcp_tool(rig.engine.tokenizer, offered)
    ro = await _rollout(rig, TASK, name=name, npm_cache=str(NPM_CACHE), max_turns=4)
    assert (ro.status, ro.reward) == ("scored", 1.0), (ro.error, ro.stderr[-3000:], ro.stdout[-3000:],
                                                       ro.verifier_output)
    [dispatch] = [json.loads(x) for x in dispatch_record_path(ro.run_id, ro.id).read_text().splitlines()]
    assert (dispatch["tool"], dispatch["arguments"]) == ("lookup", {"key": "alpha"})
    assert offered == [tool_name]  # the name the harness gave the tool (docs/harnesses.md)


@pytest.mark.slow
@pytest.mark.timeout(300)
@needs("codex")
async def test_codex_calls_a_task_tool_over_mcp(make_rig) -> None:  # noqa: F811
    """Codex: `-c mcp_servers.forge.url=...`, its bearer token read from the variable the spec names."""
    await _mcp_rollout(make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=400_000), "codex",
                       "lookup")


@pytest.mark.slow
@pytest.mark.timeout(300)
@needs("opencode")
async def test_opencode_calls_a_task_tool_over_mcp(make_rig) -> None:  # noqa: F811
    """opencode: its config's `mcp` section, merged in through OPENCODE_CONFIG_CONTENT."""
    await _mcp_rollout(make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=400_000), "opencode",
                       "forge_lookup")


async def test_a_harness_that_takes_no_tools_fails_a_tool_task_as_infrastructure(store) -> None:  # noqa: ANN001
    """The Python `MiniHarness` adapter (bench's reference) declares no [mcp]: the task could never be done
    there, so the rollout is masked with the reason, never scored 0."""
    from openforge.rollouts.harnesses.mini import MiniHarness

    config = ForgeConfig()
    runner = RolloutRunner(store, config=config, proxy_url="http://127.0.0.1:9", harness=MiniHarness(config.harness))
    run = store.create_run(kind="eval")
    [ro] = await runner.run(run.id, [RolloutSpec(TASK, 0)])
    assert (ro.status, ro.failure_kind, ro.reward) == ("failed", "infra", None)
    assert ro.error == ("infra: task tool-task has tools, but harness mini takes none (its spec has no [mcp] "
                        "table: docs/harnesses.md)")
