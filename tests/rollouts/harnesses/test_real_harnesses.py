"""The real npm harnesses against the real proxy: Claude Code, Codex and OpenClaw each call one tool
and answer, in a real local sandbox, with the scripted engine behind the proxy.

Skipped (with the reason) where node/npm or the installed packages are absent. The packages are looked
for in $FORGE_NPM_CACHE, else ~/.cache/openforge-npm (where .ci/run installs them):

    npm install --prefix ~/.cache/openforge-npm @anthropic-ai/claude-code @openai/codex
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from openforge.config import HarnessConfig, LocalSandboxConfig
from openforge.rollouts.harnesses.base import HarnessContext
from openforge.rollouts.harnesses import get_harness, npm_harness
from openforge.rollouts.harnesses.npm import find_package_bin, node_platform
from openforge.sandbox.factory import make_sandbox
from openforge.sandbox.testing import proxy_socket_path
from tests.helpers.harnesses import ANSWER, COMMAND, NPM_CACHE, check_extends, check_recording, needs, tool_then_answer
from tests.helpers.required import requires
from tests.helpers.proxy_rig import make_rig  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(120)


async def run_harness(rig: Any, name: str, timeout: float = 90, **harness: Any) -> tuple[Any, bytes]:
    """Run harness `name` in a fresh local sandbox against the rig's proxy; (ExecResult, proof.txt)."""
    adapter = get_harness(HarnessConfig(name=name, npm_cache=str(NPM_CACHE), **harness))
    async with make_sandbox(LocalSandboxConfig(read_only_paths=[str(NPM_CACHE)]), run_id=rig.rollout.run_id, rollout_id=rig.rollout.id,
                            proxy_socket=rig.proxy.uds) as sb:
        ctx = HarnessContext(proxy_url=sb.proxy_url or rig.url, api_key=rig.key, model="forge-policy",
                             instruction="Write forge-ok into proof.txt, then say you are done.",
                             workdir=sb.info.workdir, backend=sb.info.backend)
        await adapter.prepare(sb, ctx)
        result = await sb.exec(adapter.command(ctx), env=adapter.env(ctx), timeout=timeout)
        try:
            proof = await sb.read_file("proof.txt")
        except Exception:  # noqa: BLE001 - a missing file is what the assertion below reports
            proof = b""
    return result, proof


@needs("claude-code")
async def test_claude_code_runs_bash_through_the_proxy(make_rig):
    """Claude Code as deployed: 24 tools, the full system prompt (~48k tokens with the tiny tokenizer,
    hence the raised context limit), a mid-conversation system turn."""
    rig = make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=400_000)
    rig.engine.script = tool_then_answer(rig.engine.tokenizer, "Bash", {"command": COMMAND, "description": "write"})
    result, proof = await run_harness(rig, "claude-code", max_turns=4)
    assert result.exit_code == 0, result.stderr[-2000:] + result.stdout[-2000:]
    assert proof == b"forge-ok\n"
    final = json.loads(result.stdout)
    assert final["is_error"] is False and final["result"] == ANSWER and final["num_turns"] == 2
    check_extends(rig, check_recording(rig, "anthropic_messages"))


@needs("claude-code")
async def test_runner_scores_a_claude_code_rollout(make_rig):
    """The whole path of issue 5: RolloutRunner -> sandbox -> Claude Code -> proxy -> verifier -> store."""
    from openforge.config import ForgeConfig
    from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
    from openforge.rollouts.tasks.format import TaskSpec

    rig = make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=400_000)
    rig.engine.script = tool_then_answer(rig.engine.tokenizer, "Bash", {"command": COMMAND, "description": "write"})
    config = ForgeConfig()
    config.harness = HarnessConfig(name="claude-code", npm_cache=str(NPM_CACHE), max_turns=4,
                                   extra_args=["--bare", "--tools", "Bash"])
    task = TaskSpec(id="proof", instruction="Write forge-ok into proof.txt.", verifier="grep -qx forge-ok proof.txt")
    runner = RolloutRunner(rig.store, config=config, proxy_url=rig.url, proxy_socket=rig.proxy.uds)
    [ro] = await runner.run(rig.rollout.run_id, [RolloutSpec(task, 0)])
    assert (ro.status, ro.reward, ro.exit_code, ro.harness) == ("scored", 1.0, 0, "claude-code"), ro.error
    assert json.loads(ro.stdout)["result"] == ANSWER
    [traj] = rig.store.list_trajectories(rollout_ids=[ro.id])
    assert len(traj.call_ids) == 2 and (ro.n_segments, ro.n_extends) == (1, 1)


async def run_refused(rig, name: str):  # noqa: ANN001, ANN201
    """The runner on an answer task whose only right answer ("status ok") is also in the harness's
    error JSON, against a proxy whose context (4096) refuses the harness's first prompt."""
    from openforge.config import ForgeConfig
    from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
    from openforge.rollouts.tasks.format import load_tasks

    task = next(t for t in load_tasks("builtin") if t.id == "easy-status-ok")
    config = ForgeConfig()
    config.harness = HarnessConfig(name=name, npm_cache=str(NPM_CACHE), max_turns=2)
    runner = RolloutRunner(rig.store, config=config, proxy_url=rig.url, proxy_socket=rig.proxy.uds)
    [ro] = await runner.run(rig.rollout.run_id, [RolloutSpec(task)])
    assert not [c for c in rig.calls() if c.status == "ok"]  # nothing was sampled
    return ro


@needs("claude-code")
@pytest.mark.parametrize("told", [True, False], ids=["told-the-context", "told-nothing"])
async def test_claude_codes_own_prompt_over_the_context_is_a_configuration_failure(make_rig, tmp_path: Path,
                                                                                  told: bool) -> None:
    """Issue 12's case: Claude Code's ~48k-token prompt against a 4096-token context. Told the run's context
    (the shipped spec's [context], issue 47) it stops before it sends (`blocking_limit`); told nothing (a
    spec without [context]) it sends, and the proxy refuses the prompt with a 400. Either way it prints
    `"is_error": true` JSON, the rollout fails with the reason and the fix, no grader ever sees that text,
    and the prompt the harness filled itself is a configuration failure, masked (issue 44), never the
    policy's 0 (reward None)."""
    from openforge.rollouts.harnesses import BUILTIN_SPECS

    rig = make_rig(lambda ids: "status ok", uds=Path(proxy_socket_path()), max_context_tokens=4096)
    name = "claude-code"
    if not told:
        shipped = (BUILTIN_SPECS / "claude-code.toml").read_text()
        told_line = next(line for line in shipped.splitlines() if line.startswith("env = { CLAUDE_CODE_MAX_CONTEXT"))
        untold = shipped.replace(told_line, "", 1).replace('name = "claude-code"', 'name = "claude-code-untold"', 1)
        assert "{context_tokens}" not in untold and 'name = "claude-code-untold"' in untold
        (tmp_path / "claude-code-untold.toml").write_text(untold)
        name = str(tmp_path / "claude-code-untold.toml")
    ro = await run_refused(rig, name)
    final = json.loads(ro.stdout)
    calls = rig.store.list_calls(rollout_id=ro.id)
    assert final["is_error"] is True, ro.stdout[-2000:]
    if told:  # it never sent the prompt: nothing reached the proxy
        assert final.get("terminal_reason") == "blocking_limit" and calls == [], ro.stdout[-2000:]
    else:
        assert final.get("api_error_status") == 400 and {c.status for c in calls} == {"refused"}, ro.stdout[-2000:]
        assert "4095" in ro.error, ro.error  # the proxy's words: its limit
    assert (ro.status, ro.reward, ro.verifier_output, ro.failure_kind) == ("failed", None, None, "config")
    shown = "claude-code" if told else "claude-code-untold"
    assert ro.error.startswith(f"config: {shown}'s own prompt does not fit the context"), ro.error
    assert "too long" in ro.error.lower() and "[prompt]" in ro.error, ro.error


@needs("codex")
async def test_a_codex_api_error_is_a_harness_failure_not_a_reward(make_rig):
    rig = make_rig(lambda ids: "status ok", uds=Path(proxy_socket_path()), max_context_tokens=4096)
    ro = await run_refused(rig, "codex")
    assert (ro.status, ro.reward, ro.verifier_output) == ("failed", None, None), (ro.error, ro.stderr[-2000:])
    # Codex's own prompt cannot fit: a configuration failure with the fix, whatever codex printed (issue 44)
    assert ro.error.startswith("config: codex's own prompt does not fit the context"), ro.error
    assert "too long" in ro.error and ro.failure_kind == "config", ro.error


async def run_group(rig, name: str, task, **harness):  # noqa: ANN001, ANN201
    """A group of two rollouts of `task`, one after the other (the script's calls are numbered in
    order), through the runner; then the trainer's batch of that group."""
    from openforge.config import ForgeConfig
    from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
    from openforge.trainer.data import build_batch

    config = ForgeConfig()
    config.runner.concurrency = 1
    config.harness = HarnessConfig(name=name, npm_cache=str(NPM_CACHE), **harness)
    runner = RolloutRunner(rig.store, config=config, proxy_url=rig.url, proxy_socket=rig.proxy.uds)
    group = await runner.run(rig.rollout.run_id, [RolloutSpec(task, 0), RolloutSpec(task, 1)])
    batch = build_batch(group, rig.store.list_trajectories(rollout_ids=[r.id for r in group]), std_normalize=False)
    return group, batch


@pytest.mark.slow
@needs("claude-code")
async def test_a_claude_code_rollout_that_exhausts_max_turns_scores_0_and_keeps_its_group(make_rig):
    """Issue 30: the first rollout calls Bash until `--max-turns 2` stops Claude Code (error_max_turns),
    having written the file the verifier wants; the second writes it and answers. The first is the
    policy's failure: 0, never graded, and the group trains (it used to be `failed` and drop the group)."""
    from openforge.rollouts.tasks.format import TaskSpec

    rig = make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=400_000)
    tool = tool_then_answer(rig.engine.tokenizer, "Bash", {"command": COMMAND, "description": "write"})
    served = 0

    def script(prompt_ids: list[int]) -> str:
        nonlocal served
        served += 1
        return tool([]) if served <= 3 else tool(prompt_ids)  # 2 tool turns for the first rollout, then as usual

    rig.engine.script = script
    task = TaskSpec(id="proof", instruction="Write forge-ok into proof.txt.", verifier="grep -qx forge-ok proof.txt")
    [gave_up, done], batch = await run_group(rig, "claude-code", task, max_turns=2,
                                             extra_args=["--bare", "--tools", "Bash"])
    assert json.loads(gave_up.stdout)["subtype"] == "error_max_turns"
    assert (gave_up.status, gave_up.reward, gave_up.failure_kind, gave_up.verifier_output) == (
        "scored", 0.0, "policy", None), gave_up.error
    assert gave_up.error == "policy: claude-code stopped at its turn limit: Reached maximum number of turns (2)"
    assert (done.status, done.reward, done.failure_kind) == ("scored", 1.0, None), done.error
    assert (batch.n_groups, batch.dropped_groups, batch.policy_failures) == (1, 0, 1)
    assert {s.rollout_id: s.advantage for s in batch.samples} == {gave_up.id: -0.5, done.id: 0.5}


@pytest.mark.slow
@needs("codex")
async def test_a_codex_rollout_that_hits_its_output_cap_scores_0_and_keeps_its_group(make_rig):
    """Issue 30: the first rollout rambles past the output cap (the proxy's max_tokens_cap; Codex gets an
    incomplete response, "reason: max_output_tokens", and exits 1); the second answers. The first is the
    policy's failure, judged from the proxy's record of its last call (finish_reason "length")."""
    from openforge.rollouts.tasks.format import TaskSpec

    rig = make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=400_000, max_tokens_cap=24)
    served = 0

    def script(prompt_ids: list[int]) -> str:
        nonlocal served
        served += 1
        return "blah " * 200 if served == 1 else ANSWER

    rig.engine.script = script
    task = TaskSpec(id="answer", instruction="Say that you are done.", verifier="grep -q Done .forge/answer.txt")
    [rambled, done], batch = await run_group(rig, "codex", task)
    assert "Incomplete response returned, reason: max_output_tokens" in rambled.stdout
    assert [c.finish_reason for c in rig.calls(rambled.id)] == ["length"]
    assert (rambled.status, rambled.reward, rambled.failure_kind, rambled.verifier_output) == (
        "scored", 0.0, "policy", None), rambled.error
    assert rambled.error.startswith("policy: the policy's last call was cut at the output cap, then codex exited 1: ")
    assert (done.status, done.reward, done.failure_kind) == ("scored", 1.0, None), done.error
    assert (batch.n_groups, batch.dropped_groups, batch.policy_failures) == (1, 0, 1)
    assert {s.rollout_id: s.advantage for s in batch.samples} == {rambled.id: -0.5, done.id: 0.5}


@needs("codex")
async def test_codex_runs_exec_command_through_the_proxy(make_rig):
    rig = make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=400_000)
    rig.engine.script = tool_then_answer(rig.engine.tokenizer, "exec_command", {"cmd": COMMAND})
    result, proof = await run_harness(rig, "codex")
    assert result.exit_code == 0, result.stderr[-3000:]
    assert proof == b"forge-ok\n"
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]  # `exec --json`
    said = [e["item"]["text"] for e in events if e["type"] == "item.completed" and e["item"]["type"] == "agent_message"]
    assert said[-1] == ANSWER and events[-1]["type"] == "turn.completed"
    check_extends(rig, check_recording(rig, "openai_responses"))


@pytest.mark.slow
@pytest.mark.timeout(330)
@pytest.mark.skipif(os.environ.get("FORGE_TEST_OPENCLAW") != "1", reason="OpenClaw takes 20-90 s to start on this "
                    "machine: opt in with FORGE_TEST_OPENCLAW=1 (after forge harness install openclaw)")
@needs("openclaw")
@pytest.mark.parametrize("tools", [None, {"allow": ["exec"], "deny": ["tool_search", "tool_call", "tool_describe"]}],
                         ids=["built-in", "exec-only"])
async def test_openclaw_runs_exec_through_the_proxy(make_rig, tmp_path, tools):
    rig = make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=400_000)
    rig.engine.script = tool_then_answer(rig.engine.tokenizer, "exec", {"command": COMMAND})
    name = "openclaw"
    if tools is not None:  # the prompt budget: a user's copy of the spec whose [prompt] config trims its tools
        from openforge.rollouts.harnesses import BUILTIN_SPECS

        name = str(tmp_path / "openclaw-exec.toml")
        Path(name).write_text((BUILTIN_SPECS / "openclaw.toml").read_text()
                              + f"\n[prompt]\nconfig = {{ tools = {json.dumps(tools).replace(':', ' =')} }}\n")
    result, proof = await run_harness(rig, name, timeout=300)
    assert result.exit_code == 0, result.stderr[-3000:] + result.stdout[-2000:]
    assert proof == b"forge-ok\n"
    final = json.loads(result.stdout[result.stdout.index("{"):])
    assert final["ok"] is True and final["final"] == ANSWER
    sent = sorted(t["function"]["name"] for t in rig.calls()[0].request_json["tools"])
    # Built-in: its headless run's 11 tools (20,638 prompt tokens in docs/harnesses.md); trimmed: exec alone.
    assert sent == ["exec"] if tools else {"exec", "read", "write", "tool_search"} <= set(sent)
    # With its built-in tools OpenClaw rewrites its history between calls (an internal-context user message
    # moves behind the tool result; tool-call ids and argument JSON are re-serialised): each call is its own
    # segment. With exec alone it sends the second call as an extension of the first: one sequence.
    stats = check_recording(rig, "openai_chat")
    assert (stats["n_segments"], stats["n_extends"]) == ((2, 0) if tools is None else (1, 1))


# -- adapters without the packages: what they run, and how they fail -----------------------------

def ctx_for(backend: str = "local", instruction: str = "-v is not a flag here") -> HarnessContext:
    return HarnessContext(proxy_url="http://127.0.0.1:8700/", api_key="sk-rollout", model="forge-policy",
                          instruction=instruction, workdir="/work", backend=backend)


def test_adapters_point_the_harness_at_the_proxy(tmp_path):
    config = HarnessConfig(name="claude-code", npm_cache=str(tmp_path))
    claude = get_harness(config)
    env, cmd = claude.env(ctx_for()), claude.command(ctx_for())
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8700" and env["ANTHROPIC_API_KEY"] == "sk-rollout"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1" and env["IS_SANDBOX"] == "1"
    assert cmd[-2:] == ["--", "-v is not a flag here"] and cmd[cmd.index("--model") + 1] == "forge-policy"
    codex = get_harness(config.model_copy(update={"name": "codex"}))
    cmd = codex.command(ctx_for("docker"))
    assert cmd[:2] == ["codex", "exec"] and cmd[-2:] == ["--", "-v is not a flag here"]
    assert "model_providers.forge.base_url=http://127.0.0.1:8700/v1" in cmd
    assert "model_providers.forge.wire_api=responses" in cmd and "--dangerously-bypass-approvals-and-sandbox" in cmd
    assert codex.env(ctx_for())["FORGE_API_KEY"] == "sk-rollout"


def test_openclaw_and_zeroclaw_configs_name_the_proxy():
    import tomllib

    from openforge.rollouts.harnesses.openclaw import openclaw_config
    from openforge.rollouts.harnesses.spec import expand

    provider = openclaw_config(ctx_for())["models"]["providers"]["forge"]
    assert provider["baseUrl"] == "http://127.0.0.1:8700/v1" and provider["apiKey"] == "sk-rollout"
    assert provider["api"] == "openai-completions" and provider["models"][0]["id"] == "forge-policy"
    zeroclaw = get_harness(HarnessConfig(name="zeroclaw", max_turns=5))  # specs/zeroclaw.toml
    values = zeroclaw.values(ctx_for())
    zc = tomllib.loads(expand(zeroclaw.spec.run.files[".forge/zeroclaw/config.toml"], values))
    assert zc["default_provider"] == "custom:http://127.0.0.1:8700/v1" and zc["api_key"] == "sk-rollout"
    assert zc["autonomy"]["level"] == "full" and zc["agent"]["max_tool_iterations"] == 5
    assert zeroclaw.command(ctx_for()) == ["zeroclaw", "agent", "-m", "-v is not a flag here"]  # not on the PATH here
    assert zeroclaw.env(ctx_for())["ZEROCLAW_WORKSPACE"].endswith("/.forge/zeroclaw")


def openclaw_cache(cache: Path) -> tuple[Path, Path]:
    """A harness cache laid out as npm lays out OpenClaw's (without the 1 GB install): its mjs and Node."""
    mjs = cache / "node_modules" / "openclaw" / "openclaw.mjs"
    node = cache / "node_modules" / "node-{}-{}".format(*node_platform()) / "bin" / "node"
    for exe in (mjs, node):
        exe.parent.mkdir(parents=True)
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    (cache / "node_modules" / ".bin").mkdir()
    (cache / "node_modules" / ".bin" / "openclaw").symlink_to("../openclaw/openclaw.mjs")
    return mjs, node


async def test_openclaw_runs_its_mjs_on_the_caches_node_with_its_config(tmp_path):
    """specs/openclaw.toml + its hook, without the 1 GB install: a cache laid out as npm lays it out."""
    from openforge.rollouts.harnesses import harness_class

    cache = tmp_path / "cache"
    mjs, node = openclaw_cache(cache)
    adapter = get_harness(HarnessConfig(name="openclaw", npm_cache=str(cache), extra_args=["--verbose"]))
    async with make_sandbox(LocalSandboxConfig(read_only_paths=[str(cache)]), run_id="run-x", rollout_id="ro-oc") as sb:
        ctx = HarnessContext(proxy_url="http://127.0.0.1:8700/", api_key="sk-rollout", model="forge-policy",
                             instruction="-v is not a flag here", workdir=sb.info.workdir, backend=sb.info.backend)
        await adapter.prepare(sb, ctx)
        cmd = adapter.command(ctx)
        assert cmd[cmd.index(str(node)):] == [
            str(node), str(mjs), "agent", "exec", "--config", ".forge/openclaw.json", "--cwd", sb.info.workdir, "--json",
            "--model", "forge/forge-policy", "--message-file", ".forge/instruction.txt", "--verbose"]
        tmp_writable = (await sb.exec(["/bin/sh", "-c", "test -w /tmp"], timeout=30)).exit_code == 0
        assert (cmd[:2] == ["/bin/sh", "-c"] and "--bind \"$TMPDIR\" /tmp" in cmd[2]) is not tmp_writable
        config = json.loads(await sb.read_file(".forge/openclaw.json"))
        mode = await sb.exec(["stat", "-c", "%a", ".forge/openclaw.json"], timeout=30)
        assert (config["models"]["providers"]["forge"]["apiKey"], mode.stdout.strip()) == ("sk-rollout", "600")
        assert await sb.read_file(".forge/instruction.txt") == b"-v is not a flag here"
    assert adapter.env(ctx) == {"NO_COLOR": "1", "FORCE_COLOR": "0"}
    assert harness_class("openclaw").npm_harness().needs_node == ">=24.16"  # what its image layer copies a Node for
    node.unlink()
    assert harness_class("openclaw").missing(cache) == \
        f"harness 'openclaw' needs Node >=24.16 in {cache}: run `forge harness install openclaw --cache {cache}`"


async def test_a_users_openclaw_spec_sets_its_tool_profile_in_the_config_file(tmp_path):
    """The prompt budget: a user's copy of specs/openclaw.toml with a [prompt] config, which the hook lays
    over the config file it writes (OpenClaw sends only the tools its profile and allow list leave)."""
    from openforge.errors import HarnessError
    from openforge.rollouts.harnesses import BUILTIN_SPECS

    cache = tmp_path / "cache"
    openclaw_cache(cache)
    builtin = (BUILTIN_SPECS / "openclaw.toml").read_text()
    assert "[prompt]" not in builtin  # the built-in sends every tool, as before
    spec = tmp_path / "openclaw-coding.toml"
    spec.write_text(builtin.replace('name = "openclaw"', 'name = "openclaw-coding"', 1) + '\n[prompt]\n'
                    'config = { tools = { profile = "coding", allow = ["exec"] }, models = { mode = "merge" } }\n')
    adapter = get_harness(HarnessConfig(name=str(spec), npm_cache=str(cache)))
    async with make_sandbox(LocalSandboxConfig(read_only_paths=[str(cache)]), run_id="run-x", rollout_id="ro-oc2") as sb:
        ctx = HarnessContext(proxy_url="http://127.0.0.1:8700/", api_key="sk-rollout", model="forge-policy",
                             instruction="hi", workdir=sb.info.workdir, backend=sb.info.backend)
        await adapter.prepare(sb, ctx)
        config = json.loads(await sb.read_file(".forge/openclaw.json"))
    assert config["tools"] == {"profile": "coding", "allow": ["exec"]}
    # Tables are merged key by key: the spec's models.mode replaced, the proxy provider kept.
    assert config["models"]["mode"] == "merge" and config["models"]["providers"]["forge"]["apiKey"] == "sk-rollout"
    assert config["agents"]["defaults"]["model"]["primary"] == "forge/forge-policy"
    # A spec whose harness writes no config file cannot take one: refused in one line naming the field.
    plain = tmp_path / "plain.toml"
    plain.write_text('name = "plain"\n[api]\nflavour = "openai-chat"\n[run]\nprogram = "sh"\n'
                     '[prompt]\nconfig = { tools = { profile = "coding" } }\n')
    with pytest.raises(HarnessError, match=r"plain\.toml: prompt\.config: SpecHarness writes no config file"):
        get_harness(HarnessConfig(name=str(plain)))


def test_cache_lookup_prefers_native_binaries(tmp_path):
    modules = tmp_path / "node_modules"
    (modules / ".bin").mkdir(parents=True)
    stub = modules / "@anthropic-ai" / "claude-code" / "bin" / "claude.exe"
    stub.parent.mkdir(parents=True)
    stub.write_text("#!/bin/sh\necho 'postinstall did not run'\n")
    (modules / ".bin" / "claude").symlink_to(stub)
    assert find_package_bin(tmp_path, "claude-code", npm_harness("claude-code")) is None  # the placeholder is not Claude Code
    osname, cpu = node_platform()
    native = modules / "@openai" / f"codex-{osname}-{cpu}" / "vendor" / "triple" / "bin" / "codex"
    native.parent.mkdir(parents=True)
    native.write_text("#!/bin/sh\n")
    native.chmod(0o755)
    assert find_package_bin(tmp_path, "codex", npm_harness("codex")) == native


async def test_missing_harnesses_fail_with_the_fix(tmp_path):
    from openforge.errors import HarnessError

    async with make_sandbox(LocalSandboxConfig(), run_id="run-x", rollout_id="ro-missing") as sb:
        ctx = ctx_for(sb.info.backend)
        for name in ("claude-code", "codex", "openclaw"):
            adapter = get_harness(HarnessConfig(name=name, npm_cache=str(tmp_path / "empty")))
            with pytest.raises(HarnessError, match=f"npm install --prefix {tmp_path / 'empty'}"):
                await adapter.prepare(sb, ctx)
        with pytest.raises(HarnessError, match="not on npm"):
            await get_harness(HarnessConfig(name="zeroclaw")).prepare(sb, ctx)


@pytest.mark.parametrize(("stdout", "code", "answer", "failure"), [
    ('{"type":"result","subtype":"success","is_error":false,"num_turns":2,"result":"Done."}', 0, "Done.", None),
    ('{"type":"result","subtype":"success","is_error":true,"api_error_status":400,'
     '"result":"API Error: 400 prompt is too long","num_turns":1}', 1, None, "API error 400: prompt is too long"),
    ('{"type":"result","subtype":"success","is_error":true,"api_error_status":529,'
     '"result":"API Error: 529 overloaded","num_turns":3,"terminal_reason":"model_error"}', 1, None,
     "API error 529: overloaded"),
    ('{"type":"result","is_error":false,"result":"Done."}', 1, None, "claude-code exited 1 after a result"),
    ("Error: something broke", 1, None, "claude-code exited 1 without its result JSON: Error: something broke"),
])
def test_claude_code_outcome_reads_its_json(stdout: str, code: int, answer: str | None, failure: str | None):
    """Answers and harness failures; the policy's own endings (turn limit, context) are in
    tests/rollouts/runner/test_rollout_endings.py, read from Claude Code's recorded output."""
    from openforge.rollouts.harnesses.claude_code import claude_outcome
    from openforge.sandbox.base import ExecResult

    got = claude_outcome(ExecResult(exit_code=code, stdout=stdout, stderr=""))
    assert (got.answer, got.failure, got.policy_failure) == (answer, failure, None)


@pytest.mark.parametrize(("stdout", "answer", "failure"), [
    ('[plugins] loaded\n{"ok": true, "final": "Done."}', "Done.", None),
    ('{"ok": false, "error": {"message": "400 prompt too long"}}', None, "openclaw reported an error: 400 prompt too long"),
    ("booting...", None, "openclaw exited 0 without its result JSON: booting..."),
])
def test_openclaw_outcome_reads_its_json(stdout: str, answer: str | None, failure: str | None):
    from openforge.rollouts.harnesses.openclaw import openclaw_outcome
    from openforge.sandbox.base import ExecResult

    got = openclaw_outcome(ExecResult(exit_code=0, stdout=stdout, stderr=""))
    assert (got.answer, got.failure) == (answer, failure)


def test_harness_available_names_the_fix(tmp_path):
    from openforge.config import ForgeConfig, sandbox_config
    from openforge.rollouts.harnesses import harness_available

    config = ForgeConfig()
    assert harness_available(config) is None  # mini, local: this venv has openai
    config.harness = HarnessConfig(name="claude-code", npm_cache=str(tmp_path / "empty"))
    assert harness_available(config) == (f"harness 'claude-code' is not installed in {tmp_path / 'empty'}: "
                                         f"run `forge harness install claude-code --cache {tmp_path / 'empty'}`")
    docker = config.model_copy(update={"sandbox": sandbox_config("docker")})
    assert harness_available(docker) is None  # the image's install is checked by prepare, in the container
    config.harness = HarnessConfig(name="zeroclaw")
    assert "cargo install zeroclaw" in harness_available(config)
    if find_package_bin(NPM_CACHE, "codex", npm_harness("codex")) is not None:
        config.harness = HarnessConfig(name="codex", npm_cache=str(NPM_CACHE))
        assert harness_available(config) is None


def test_forge_harness_install_reports_an_installed_harness_and_npm_errors(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from openforge.forge_cli.main import app

    if find_package_bin(NPM_CACHE, "codex", npm_harness("codex")) is not None:
        out = CliRunner().invoke(app, ["harness", "install", "codex", "--cache", str(NPM_CACHE)])
        assert out.exit_code == 0 and f"codex ready: {find_package_bin(NPM_CACHE, 'codex', npm_harness('codex'))}" in out.output, out.output
    out = CliRunner().invoke(app, ["harness", "install", "mini"])  # a spec with nothing to install: forge's python
    assert out.exit_code == 0 and "mini ready: " in out.output, out.output
    out = CliRunner().invoke(app, ["harness", "install", "zeroclaw"])
    assert out.exit_code == 1 and "'zeroclaw' has nothing `forge harness install` can install" in out.output
    assert "Traceback" not in out.output
    monkeypatch.setenv("PATH", str(tmp_path))  # no npm anywhere
    out = CliRunner().invoke(app, ["harness", "install", "claude-code", "--cache", str(tmp_path / "c")])
    assert out.exit_code == 1 and "npm is not installed" in out.output


@pytest.mark.npm
@requires("npm", None if shutil.which("npm") else "npm is not installed")
def test_npm_install_streams_progress_and_fails_in_one_line(tmp_path):
    from openforge.errors import HarnessError
    from openforge.rollouts.harnesses.npm import install_packages

    lines: list[str] = []
    try:
        install_packages(["is-number@7.0.0"], tmp_path, timeout=120, on_line=lines.append)
    except HarnessError as exc:
        pytest.skip(f"the npm registry is not reachable here: {exc}")
    assert (tmp_path / "node_modules" / "is-number" / "package.json").is_file()
    assert any("http fetch" in line for line in lines), lines  # the progress the CLI shows
    with pytest.raises(HarnessError, match="npm install no-such-package-forge-xyz@0.0.0 failed: "):
        install_packages(["no-such-package-forge-xyz@0.0.0"], tmp_path, timeout=120)
