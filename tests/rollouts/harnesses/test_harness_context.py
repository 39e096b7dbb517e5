"""The harness is told the run's real context size: `{context_tokens}` in a spec's [context] table, filled
from the proxy's limit (issue 47).

The runner asks the proxy once (its model listing's `context_length`: the engine's context, or
proxy.max_context_tokens where lower) and the built-in specs pass it on: Codex as
`-c model_context_window=N`, Claude Code as CLAUDE_CODE_MAX_CONTEXT_TOKENS and
CLAUDE_CODE_AUTO_COMPACT_WINDOW. A run's own values (harness.extra_args, a spec's [run.env]) win."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from openforge.config import ForgeConfig, HarnessConfig
from openforge.proxy import breaks
from openforge.rollouts.harnesses import BUILTIN_SPECS, get_harness
from openforge.rollouts.harnesses.base import HarnessContext
from openforge.rollouts.harnesses.spec import HarnessSpecError, load_spec
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.sandbox.testing import proxy_socket_path
from tests.helpers.proxy_rig import make_rig  # noqa: F401 - fixture
from tests.helpers.harnesses import TASK, compacting_policy
from tests.helpers.harnesses import NPM_CACHE, needs


def ctx(context_tokens: int | None) -> HarnessContext:
    return HarnessContext(proxy_url="http://127.0.0.1:8700", api_key="sk-r", model="forge-policy",
                          instruction="do it", workdir="/work", context_tokens=context_tokens)


def test_the_built_in_specs_carry_the_runs_context_size() -> None:
    codex = get_harness(HarnessConfig(name="codex"))
    assert "model_context_window=40960" in codex.command(ctx(40960))
    assert not any("model_context_window" in a for a in codex.command(ctx(None)))  # unknown: not told
    claude = get_harness(HarnessConfig(name="claude-code"))
    env = claude.env(ctx(40960))
    assert (env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"], env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"]) == ("40960", "40960")
    assert "CLAUDE_CODE_MAX_CONTEXT_TOKENS" not in claude.env(ctx(None))


def test_a_runs_own_values_win_over_the_built_in_context(tmp_path: Path) -> None:
    codex = get_harness(HarnessConfig(name="codex", extra_args=["-c", "model_context_window=34000"]))
    windows = [a for a in codex.command(ctx(40960)) if a.startswith("model_context_window=")]
    assert windows[-1] == "model_context_window=34000"  # Codex takes the last -c of a key
    spec = tmp_path / "claude-code-48k.toml"  # a user's copy of the built-in spec, with its own window
    spec.write_text((BUILTIN_SPECS / "claude-code.toml").read_text().replace(
        'IS_SANDBOX = "1"\n', 'IS_SANDBOX = "1"\nCLAUDE_CODE_MAX_CONTEXT_TOKENS = "48000"\n'))
    env = get_harness(HarnessConfig(name=str(spec))).env(ctx(40960))
    assert (env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"], env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"]) == ("48000", "40960")


@pytest.mark.parametrize(("old", "new", "message"), [
    ("={context_tokens}", "={context_window}", "context.args[1]: unknown placeholder {context_window}; known: "),
    ('"--color", "never"', '"--color={context_tokens}"', "{context_tokens} may only be used in [context]"),
])
def test_a_context_placeholder_out_of_place_or_misspelt_is_refused(tmp_path: Path, old: str, new: str,
                                                                   message: str) -> None:
    text = (BUILTIN_SPECS / "codex.toml").read_text()
    assert old in text
    path = tmp_path / "codex.toml"
    path.write_text(text.replace(old, new))
    with pytest.raises(HarnessSpecError) as err:
        load_spec(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value), str(err.value)


async def test_the_proxy_reports_its_context_and_the_runner_asks_it_once(make_rig) -> None:
    rig = make_rig(["ok"], max_context_tokens=34000)
    async with httpx.AsyncClient() as client:
        listing = (await client.get(rig.url + "/v1/models", headers={"x-api-key": rig.key})).json()
    assert listing["data"][0]["context_length"] == 34000  # the lower of the engine's context and the setting
    runner = RolloutRunner(rig.store, config=ForgeConfig(), proxy_url=rig.url)
    assert await runner.context_tokens(rig.key) == 34000
    assert await runner.context_tokens("not-a-key") == 34000  # asked once per runner
    unreachable = RolloutRunner(rig.store, config=ForgeConfig(), proxy_url="http://127.0.0.1:9")
    assert await unreachable.context_tokens(rig.key) is None  # not told, not a failed rollout


@needs("codex")
@pytest.mark.timeout(180)
async def test_codex_compacts_at_the_runs_context_with_no_setting_of_its_own(make_rig) -> None:
    """proxy.max_context_tokens = 34000 and no `-c` in harness.extra_args: the built-in spec tells Codex the
    window, and it compacts once before the proxy would refuse a prompt (the third part's turn passes 90%)."""
    rig = make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=34000)
    rig.engine.script = compacting_policy(rig.engine.tokenizer, give_up_second=False)
    config = ForgeConfig()
    config.harness = HarnessConfig(name="codex", npm_cache=str(NPM_CACHE), max_turns=12)
    runner = RolloutRunner(rig.store, config=config, proxy_url=rig.url, proxy_socket=rig.proxy.uds)
    [ro] = await runner.run(rig.rollout.run_id, [RolloutSpec(TASK, 0)])
    assert (ro.status, ro.reward) == ("scored", 1.0), (ro.error, ro.stderr[-1500:] if ro.stderr else None)
    calls = [c for c in rig.calls(ro.id) if c.status == "ok"]
    assert len([c for c in calls if c.side == "compaction"]) == 1
    assert len([c for c in calls if c.break_reason == breaks.COMPACTED]) == 1
    assert not [c for c in rig.calls(ro.id) if c.status != "ok"]  # no prompt refused as over the context


@needs("claude-code")
@pytest.mark.timeout(180)
async def test_claude_code_compacts_at_the_runs_context_with_no_setting_of_its_own(make_rig, tmp_path: Path,
                                                                                    monkeypatch) -> None:
    """proxy.max_context_tokens = 48000 and the built-in spec as it ships (the compaction test's run, its
    copy of the spec given no settings of its own): Claude Code reports a 48k window and compacts
    proactively near 15k tokens (48k - 20k - 13k), before the proxy would refuse a prompt."""
    from tests.rollouts.harnesses import test_harness_compaction as compaction

    shipped = tmp_path / "specs"
    shipped.mkdir()  # the line the compaction test adds its settings after, spelt so that none are added
    (shipped / "claude-code.toml").write_text((BUILTIN_SPECS / "claude-code.toml").read_text().replace(
        'IS_SANDBOX = "1"\n', 'IS_SANDBOX = "1"  \n'))
    monkeypatch.setattr(compaction, "BUILTIN_SPECS", shipped)
    rig = make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=48000)
    ro = await compaction.run_claude_compacting(rig, tmp_path)
    assert (ro.status, ro.reward) == ("scored", 1.0), (ro.error, ro.stdout[-1500:])
    assert json.loads(ro.stdout)["modelUsage"]["forge-policy"]["contextWindow"] == 48000
    calls = sorted(rig.calls(ro.id), key=lambda c: c.seq)
    [summary] = [c for c in calls if c.side == "compaction"]
    assert [c.seq for c in calls if c.break_reason == breaks.COMPACTED] == [summary.seq + 1]
    assert summary.prompt_tokens < 33000 and all(c.status == "ok" for c in calls)  # proactive: none refused
