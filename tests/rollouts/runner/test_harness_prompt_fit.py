"""A brought agent whose own prompt cannot fit (issue 44): the proxy records the refusal, the rollout is
a configuration failure (masked and counted, never the policy's 0), a step where most rollouts fail so
stops the run with the fix; a harness's side calls are tagged and not trained on; the policy samples
by the run's settings whatever temperature the harness sends; `forge harness check` says all of it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest
from typer.testing import CliRunner

from openforge.config import ForgeConfig, HarnessConfig
from openforge.forge_cli.main import app
from tests.helpers.harnesses import NPM_CACHE, needs
from tests.helpers.proxy_rig import make_rig  # noqa: F401 - fixture

# A side call (a title, as Claude Code's or OpenClaw's) that fits, then the main call: the system prompt
# the harness itself writes, {size} words of it, then the task. Answer: the main call's text.
AGENT = '''
import os, sys, openai
client = openai.OpenAI(max_retries=0)
model = os.environ["AGENT_MODEL"]
task = open(".forge/instruction.txt").read()
client.chat.completions.create(model=model, max_tokens=4, temperature={temperature},
    messages=[{{"role": "system", "content": "Write a short title for this conversation."}},
              {{"role": "user", "content": task}}])
try:
    reply = client.chat.completions.create(model=model, max_tokens=8, temperature={temperature},
        messages=[{{"role": "system", "content": "rule " * {size}}}, {{"role": "user", "content": task}}])
except openai.BadRequestError as exc:
    print(f"API Error: {{exc}}", file=sys.stderr)
    sys.exit(1)
print(reply.choices[0].message.content)
print("tokens used: 42")
'''

SPEC = '''
name = "bloated"
[api]
flavour = "openai-chat"
base_url_env = ["OPENAI_BASE_URL"]
api_key_env = ["OPENAI_API_KEY"]
model_env = ["AGENT_MODEL"]
[run]
program = "{{python}}"
args = [".forge/agent.py"]
copy_files = {{ ".forge/agent.py" = "agent.py" }}
[answer]
source = "stdout"
{extra}
'''

TASK_ANSWER = "done"


def write_agent(folder: Path, *, size: int, temperature: float = 1.0, extra: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "agent.py").write_text(AGENT.format(size=size, temperature=temperature))
    spec = folder / "bloated.toml"
    spec.write_text(SPEC.format(extra=extra))
    return spec


async def run_rollouts(rig: Any, spec: Path, n: int = 2) -> list[Any]:
    from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
    from openforge.rollouts.tasks.format import TaskSpec

    config = ForgeConfig()
    config.harness = HarnessConfig(name=str(spec))
    task = TaskSpec(id="say", instruction="Say done.", verifier="true")
    runner = RolloutRunner(rig.store, config=config, proxy_url=rig.url, proxy_socket=rig.proxy.uds)
    return await runner.run(rig.rollout.run_id, [RolloutSpec(task, i) for i in range(n)])


def rig_for(make_rig: Any, **proxy: Any) -> Any:
    from openforge.sandbox.testing import proxy_socket_path

    return make_rig(lambda ids: TASK_ANSWER, uds=Path(proxy_socket_path()), max_context_tokens=512, **proxy)


async def test_a_prompt_the_harness_filled_past_the_context_is_a_configuration_failure(make_rig: Any,
                                                                                     tmp_path: Path) -> None:
    from openforge.rollouts.runner.failures import PromptDoesNotFit

    rig = rig_for(make_rig)
    rollouts = await run_rollouts(rig, write_agent(tmp_path, size=2000))
    for ro in rollouts:
        assert (ro.status, ro.failure_kind, ro.reward) == ("failed", "config", None), (ro.error, ro.stderr)
        assert "[prompt]" in ro.error and "context" in ro.error and "512" in ro.error
        calls = rig.calls(ro.id)
        assert [c.status for c in calls] == ["ok", "refused"]  # the side call answered, the main one refused
        assert calls[1].policy_turns == 0 and calls[1].prompt_tokens > 512
        assert "prompt is too long" in calls[1].error
    with pytest.raises(PromptDoesNotFit) as stop:  # a step of them stops the run, naming the fix
        PromptDoesNotFit.check("step 0", rollouts)
    assert "2 of 2 rollouts" in str(stop.value) and "[prompt]" in str(stop.value)
    assert "proxy.max_context_tokens" in str(stop.value)


async def test_a_prompt_that_fits_is_graded_and_its_side_call_is_not_trained_on(make_rig: Any,
                                                                               tmp_path: Path) -> None:
    from openforge.rollouts.runner.failures import PromptDoesNotFit

    rig = rig_for(make_rig)
    extra = "[side_calls]\nmatch = { title = \"^Write a short title\" }\n"
    [ro] = await run_rollouts(rig, write_agent(tmp_path, size=20, extra=extra), n=1)
    assert (ro.status, ro.reward, ro.failure_kind) == ("scored", 1.0, None), (ro.error, ro.stderr)
    side, main = rig.calls(ro.id)
    assert (side.side, main.side) == ("title", None)
    trained = [c for t in rig.store.list_trajectories(rollout_ids=[ro.id]) for c in t.call_ids]
    assert trained == [main.id]  # the title is recorded, tagged, and left out of the trajectory
    PromptDoesNotFit.check("step 0", [ro])  # nothing to stop for


async def test_the_policy_samples_by_the_runs_settings_whatever_the_harness_sends(make_rig: Any) -> None:
    rig = make_rig(["a", "b"])
    client = openai.OpenAI(base_url=rig.url + "/v1", api_key=rig.key, max_retries=0)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], temperature=0,
                                   top_p=0.5)
    call = rig.calls()[0]
    assert (call.temperature, call.top_p, call.top_k) == (1.0, 1.0, -1)  # what the tokens were sampled at
    assert rig.engine.requests[0]["sampling_params"]["temperature"] == 1.0
    assert call.request_json["temperature"] == 0  # what the harness asked for, as it sent it
    honoured = make_rig(["c"], sampling="harness")
    openai.OpenAI(base_url=honoured.url + "/v1", api_key=honoured.key, max_retries=0).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], temperature=0.2)
    assert honoured.calls()[0].temperature == 0.2


@pytest.mark.slow
def test_harness_check_counts_refused_calls_and_prints_the_answer(tmp_path: Path, tiny_model: Path) -> None:
    base = ["--set", f"engine.model={tiny_model}", "--set", "proxy.max_context_tokens=512"]
    bloated = write_agent(tmp_path / "big", size=2000, temperature=0)
    out = CliRunner().invoke(app, [*base, "harness", "check", str(bloated)])
    assert out.exit_code == 1, out.output
    assert "1 refused for length" in out.output
    assert "problem: its own prompt does not fit" in out.output and "[prompt]" in out.output
    assert "  ok" not in out.output
    assert "warning: it asks for temperature 0" in out.output
    fits = write_agent(tmp_path / "small", size=20)
    out = CliRunner().invoke(app, [*base, "harness", "check", str(fits)])
    assert out.exit_code == 0, out.output
    assert "answer read: 'tokens used: 42'" in out.output  # the line [answer] reads, beside its score
    assert "score " in out.output and out.output.rstrip().endswith("ok")


@needs("claude-code")
def test_harness_check_says_claude_codes_own_prompt_does_not_fit_when_it_never_sends_it(
        tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Told the run's context (its spec's [context]), Claude Code will not send a ~48k-token prompt to a
    4096-token context (`blocking_limit`): no call reaches the proxy, and the check says the prompt does not
    fit, with the fix, not that it never called the model."""
    monkeypatch.setenv("FORGE_NPM_CACHE", str(NPM_CACHE))
    out = CliRunner().invoke(app, ["--set", f"engine.model={tiny_model}", "--set", "proxy.max_context_tokens=4096",
                                   "harness", "check", "claude-code"])
    assert out.exit_code == 1, out.output
    shown = " ".join(out.output.split())
    assert "problem: its own prompt does not fit" in shown and "[prompt]" in shown, out.output
    assert "never called the model" not in shown and "0 refused for length" in shown, out.output


@pytest.mark.slow
@pytest.mark.parametrize("command", [["train", "--steps", "2"], ["eval"]], ids=["train", "eval"])
def test_a_run_whose_harness_prompt_cannot_fit_fails_with_the_fix(forge_home: Path, tiny_model: Path,
                                                                  tmp_path: Path, command: list[str]) -> None:
    """A training run stops before any step; an eval fails instead of reporting a pass rate over masked
    rollouts: one line naming the fix, exit 1, every rollout a configuration failure."""
    from tests.helpers.up import SMALL, forge

    from openforge.store import Store

    spec = write_agent(tmp_path / "agent", size=2000)
    out = forge(forge_home, *SMALL, "--set", f"engine.model={tiny_model}", "--set", "proxy.max_context_tokens=512",
                "--set", f"harness.name={spec}", "--set", "tasks.path=builtin", "--set",
                'tasks.include=["easy-say-done"]', *command)
    assert out.returncode == 1, out.stdout + out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("forge: error: ") and "[prompt]" in last, last
    store = Store(forge_home / "forge.db")
    run = store.get_run("latest")
    assert run.status == "failed" and "[prompt]" in (run.error or "") and json.dumps(run.error).count("\\n") == 0
    assert {r.failure_kind for r in store.list_rollouts(run.id)} == {"config"}
    if command[0] == "train":
        assert run.kind == "train" and not store.list_train_steps(run.id) and "max_context_tokens" in last, last
    else:
        assert run.kind == "eval" and "2 of 2 rollouts of eval" in last, last


@pytest.mark.slow
def test_dry_run_runs_the_harness_and_fails_a_prompt_that_cannot_fit(forge_home: Path, tiny_model: Path,
                                                                     tmp_path: Path) -> None:
    """`forge up --dry-run`: the plan's checks pass, then the harness runs once under the run's settings."""
    from openforge.store import Store

    spec = write_agent(tmp_path / "agent", size=2000)
    base = ["--set", f"engine.model={tiny_model}", "--set", "proxy.max_context_tokens=512", "--set",
            f"harness.name={spec}", "--set", "tasks.path=builtin", "--set", "sandbox.isolation=none"]
    out = CliRunner().invoke(app, [*base, "up", "--dry-run"])
    assert out.exit_code == 1, out.output
    [fail] = [ln.strip() for ln in out.output.splitlines() if ln.strip().startswith("FAIL")]
    assert fail.startswith("FAIL  harness bloated: its own prompt does not fit") and "[prompt]" in fail, fail
    assert "1 refused for length" in fail, fail
    assert "1 harness check(s) would stop this run" in out.output
    assert not Store(forge_home / "forge.db").list_runs()  # the check ran in a scratch store
    skipped = CliRunner().invoke(app, [*base, "up", "--dry-run", "--no-harness-check"])
    assert skipped.exit_code == 0 and skipped.output.rstrip().endswith("nothing was started; every check passed")
