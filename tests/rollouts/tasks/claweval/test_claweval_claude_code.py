"""An imported ClawEval-format task (tests/data/claweval's N001) through the real Claude Code CLI: the task's
tools reach it over the rollout's MCP server (`--mcp-config`), each call goes to the FastAPI notes service
started on the host for the rollout, the host records the dispatch, and both graders (forge's on the
service's record, ClawEval's grader.py on forge's trace) score the rollout: scored, never infra."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from openforge.config import ForgeConfig, HarnessConfig
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.runner.tool_server import dispatch_record_path
from openforge.rollouts.tasks.format import TaskSpec
from openforge.sandbox.testing import proxy_socket_path
from tests.helpers.paths import DATA
from tests.helpers.proxy_rig import make_rig  # noqa: F401 - fixture
from tests.helpers.harnesses import NPM_CACHE, needs
from tests.helpers.task_tools import call

SRC = DATA / "claweval"
pytest.importorskip("yaml", reason="the ClawEval importer needs PyYAML (pip install 'openforge[claweval]')")
pytest.importorskip("fastapi", reason="ClawEval's mock services are FastAPI apps (pip install 'openforge[claweval]')")


@pytest.mark.timeout(300)  # 9 s here on a quiet machine
@needs("claude-code")
async def test_claude_code_does_an_imported_claweval_task_through_its_mcp_tools(make_rig) -> None:  # noqa: F811
    from openforge.rollouts.tasks.claweval.importer import import_claweval

    task = TaskSpec.model_validate(import_claweval(SRC).tasks[0])
    rig = make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=400_000)
    create = call("mcp__forge__notes_create", {"title": "groceries", "body": "milk, eggs"})
    rig.engine.script = lambda ids: "Saved." if '"N-2"' in rig.engine.tokenizer.decode(ids) else create  # its new id
    config = ForgeConfig()
    config.harness = HarnessConfig(name="claude-code", npm_cache=str(NPM_CACHE), max_turns=6,
                                   extra_args=["--bare", "--tools", "Bash"])
    runner = RolloutRunner(rig.store, config=config, proxy_url=rig.url, proxy_socket=rig.proxy.uds)
    [ro] = await runner.run(rig.rollout.run_id, [RolloutSpec(task, 0)])
    assert (ro.status, ro.failure_kind, ro.reward) == ("scored", None, 1.0), (
        ro.error, ro.stderr[-3000:], ro.stdout[-3000:], ro.verifier_output)
    dispatches = [json.loads(x) for x in dispatch_record_path(ro.run_id, ro.id).read_text().splitlines()]
    assert [(d["tool"], d["arguments"]) for d in dispatches][-1] == (
        "notes_create", {"title": "groceries", "body": "milk, eggs"})
    assert "notes POST /notes/create -> 200 tool notes_create" in ro.verifier_output
    assert "claweval: completion 1, robustness 1, safety 1, communication 1 -> task score 1" in ro.verifier_output
    first = rig.store.list_calls(rollout_id=ro.id)[0].request_json
    assert {"mcp__forge__notes_list", "mcp__forge__notes_create"} <= {t["name"] for t in first["tools"]}
