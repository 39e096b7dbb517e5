"""Several harnesses in one run (`harness.names`): the config's one spelling, how groups are dealt
out, each rollout run in and recorded with its own harness, and `forge up --demo` training in two
real harnesses at once (mini and docs/examples/hello-agent, a program forge does not ship)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from openforge.config import ForgeConfig, load_config, stored_config
from openforge.errors import ConfigError, HarnessError
from openforge.rollouts.runner.evaluate import eval_specs, group_specs
from openforge.rollouts.runner.mix import group_harnesses
from openforge.rollouts.tasks.format import TaskSpec
from openforge.store import Store
from tests.helpers.paths import REPO
from tests.helpers.proxy_rig import make_rig  # noqa: F401 - fixture

HELLO = REPO / "docs" / "examples" / "hello-agent" / "hello-agent.toml"


def test_names_and_name_are_one_setting() -> None:
    config = load_config(sets=['harness.names=["mini", "codex"]'], preset="demo")  # the preset's name gives way
    assert (config.harness.name, config.harness.weights()) == ("mini", {"mini": 1.0, "codex": 1.0})
    config = load_config(sets=["harness.names={codex = 3, mini = 1}"], preset="demo")
    assert config.harness.name == "codex" and config.harness.weights() == {"codex": 3.0, "mini": 1.0}
    assert stored_config(config.model_dump(mode="json")).harness == config.harness  # a resume reads it back
    one = config.harness.one("mini")
    assert (one.name, one.names, one.max_turns) == ("mini", [], config.harness.max_turns)
    assert load_config().harness.weights() == {"mini": 1.0}


def test_a_later_layer_in_one_spelling_replaces_the_other(tmp_path: Path) -> None:
    file = tmp_path / "forge.toml"
    file.write_text('[harness]\nnames = ["mini", "codex"]\n')
    assert load_config(file, overrides={"harness": {"name": "codex"}}).harness.weights() == {"codex": 1.0}
    file.write_text('[harness]\nname = "codex"\n')
    assert load_config(file, sets=['harness.names=["mini", "codex"]']).harness.name == "mini"


@pytest.mark.parametrize("sets, why", [
    (['harness.names=["mini", "mini"]'], "lists a harness twice"),
    (["harness.names={mini = 0}"], "weight must be a number > 0"),
    (['harness.names=["mini"]', "harness.spec=x.toml"], "list the spec's path there"),
])
def test_conflicting_harness_settings_are_one_line(sets: list[str], why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        load_config(sets=sets)


def test_name_beside_names_is_a_conflict(tmp_path: Path) -> None:
    file = tmp_path / "forge.toml"
    file.write_text('[harness]\nname = "codex"\nnames = ["mini", "codex"]\n')
    with pytest.raises(ConfigError, match=r"harness.name 'codex' and harness.names \['mini', 'codex'\] are one"):
        load_config(file)


def test_preflight_names_every_unknown_harness() -> None:
    from openforge.runs.prepare import check_harness

    config = load_config(sets=['harness.names=["mini", "no-such-agent", "nor-this"]'])
    with pytest.raises(HarnessError, match="unknown harness 'no-such-agent'.*; unknown harness 'nor-this'"):
        check_harness(config)


def test_groups_follow_the_weights_deterministically() -> None:
    assert group_harnesses({"a": 1, "b": 1, "c": 1}, 0, 6) == ["a", "b", "c", "a", "b", "c"]
    dealt = group_harnesses({"a": 3.0, "b": 1.0}, 0, 400)
    assert Counter(dealt) == {"a": 300, "b": 100}
    assert all(abs(dealt[:n].count("a") - 0.75 * n) <= 1 for n in range(1, 400))  # at every prefix
    assert group_harnesses({"a": 3.0, "b": 1.0}, 37, 9) == dealt[37:46]  # a step's groups: a pure function


def test_a_group_never_mixes_harnesses() -> None:
    tasks = [TaskSpec.model_validate({"id": f"t{i}", "instruction": "x", "expect_answer": {"number": i}})
             for i in range(3)]
    specs = group_specs(tasks, 4, ["a", "b", "a"])
    assert [(s.task.id, s.harness) for s in specs[::4]] == [("t0", "a"), ("t1", "b"), ("t2", "a")]
    assert all(len({s.harness for s in specs if s.task.id == t.id}) == 1 for t in tasks)
    evals = eval_specs(tasks, 2, ["a", "b"])  # an eval runs every task in every harness, a group each
    assert Counter((s.task.id, s.harness) for s in evals) == {(t.id, h): 2 for t in tasks for h in "ab"}


async def test_each_rollout_runs_in_the_harness_its_spec_names(make_rig) -> None:  # noqa: ANN001
    """mini and the docs' hello-agent in one runner call, through the real proxy and sandboxes."""
    from openforge.rollouts.runner.runner import RolloutRunner
    from openforge.sandbox.testing import proxy_socket_path

    rig = make_rig([], uds=Path(proxy_socket_path()))
    rig.engine.script = lambda ids: "7"
    config = ForgeConfig()
    config.harness = load_config(sets=[f'harness.names=["mini", "{HELLO}"]']).harness
    task = TaskSpec.model_validate({"id": "seven", "instruction": "Answer with a number: 7.",
                                    "expect_answer": {"number": 7}})
    runner = RolloutRunner(rig.store, config=config, proxy_url=rig.url, proxy_socket=rig.proxy.uds)
    rollouts = await runner.run(rig.rollout.run_id, group_specs([task, task], 2, ["mini", str(HELLO)]))
    assert [(r.harness, r.status) for r in rollouts] == [("mini", "scored")] * 2 + [("hello-agent", "scored")] * 2, \
        [(r.error, r.stderr[-500:]) for r in rollouts]
    assert all(r.reward == 1.0 for r in rollouts), [r.verifier_output for r in rollouts]
    first_prompts = {r.harness: rig.calls(r.id)[0].request_json for r in rollouts}
    assert first_prompts["mini"] != first_prompts["hello-agent"]  # two programs, not one under two names


@pytest.mark.slow
def test_demo_trains_in_two_harnesses_at_once(forge_home: Path) -> None:
    """`forge up --demo` with mini and the docs' hello-agent: two steps of two groups, one per harness.
    The proxy caps every call at one token (mini's demo setting; hello-agent asks for 256), so both
    answer the demo's question with a digit. Learning is not measured here: 2 steps show the loop."""
    from tests.helpers.up import forge

    out = forge(forge_home, "--set", f'harness.names=["mini", "{HELLO}"]', "--set", "proxy.max_tokens_cap=1",
                "--set", "runner.samples_per_task=4", "--set", "runner.concurrency=8",
                "up", "--demo", "--headless", "--steps", "2", timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    store = Store(forge_home / "forge.db")
    run = store.get_run("latest")
    assert run.status == "finished"
    rollouts = store.list_rollouts(run.id)
    groups: dict[tuple[int, str], set[str]] = {}
    for r in rollouts:
        groups.setdefault((r.step, r.task_id), set()).add(r.harness)
    assert all(len(h) == 1 for h in groups.values()), groups  # a group never mixes harnesses
    assert Counter(r.harness for r in rollouts) == {"mini": 8, "hello-agent": 8}
    assert all(r.status == "scored" and r.n_calls >= 1 for r in rollouts), \
        [(r.harness, r.status, r.error) for r in rollouts if r.status != "scored"]
    steps = store.list_train_steps(run.id)
    assert [s.step for s in steps] == [0, 1] and all(s.loss is not None and s.n_tokens > 0 for s in steps)
    for s in steps:  # each harness's reward mean, from that step's rollouts
        rewards = {h: [r.reward for r in rollouts if r.step == s.step and r.harness == h] for h in ("mini", "hello-agent")}
        assert s.metrics_json["reward_by_harness"] == {h: pytest.approx(sum(v) / len(v)) for h, v in rewards.items()}
    shown = forge(forge_home, "show", "latest")
    assert "by harness: hello-agent " in shown.stdout and " over 8, mini " in shown.stdout, shown.stdout
    analysis = forge(forge_home, "analyze", "latest", "--by", "harness", "--json")
    assert analysis.returncode == 0, analysis.stderr
    assert sorted((g["key"], g["n_rollouts"]) for g in json.loads(analysis.stdout)["groups"]) == \
        [("hello-agent", 8), ("mini", 8)]


def test_forge_eval_runs_every_task_in_each_harness(tiny_model: Path, store: Store) -> None:
    from typer.testing import CliRunner

    from openforge.engine.scripted import ScriptedEngine
    from openforge.engine.serve import serve_in_thread
    from openforge.forge_cli.main import app

    engine = ScriptedEngine(tiny_model, lambda ids: "hello world")  # right for one task, wrong for the other
    with serve_in_thread(engine.app) as eng:
        out = CliRunner().invoke(app, [
            "--set", f'harness.names=["mini", "{HELLO}"]', "eval", "--tasks", "builtin", "--task", "easy-say-hello",
            "--task", "easy-say-done", "-k", "2", "--pass-k", "1", "--concurrency", "4", "--engine-url", eng.url,
            "--model", str(tiny_model)])
    assert out.exit_code == 0, out.output
    assert "harness mini, " in out.output and "hello-agent.toml" in out.output
    assert "hello-agent: mean reward 0.50, pass@1 0.50 over 4; no infra failures" in out.output
    assert "mini: mean reward 0.50, pass@1 0.50 over 4; no infra failures" in out.output
    [run] = store.list_runs()
    assert Counter((r.task_id, r.harness) for r in store.list_rollouts(run.id)) == {
        (t, h): 2 for t in ("easy-say-hello", "easy-say-done") for h in ("mini", "hello-agent")}
    assert set(run.summary_json["by_harness"]) == {"mini", "hello-agent"}


def test_the_dashboard_header_shows_each_harness_reward() -> None:
    from openforge.forge_cli.dashboard import _harnesses
    from openforge.store import TrainStep

    step = TrainStep(run_id="r", step=0, metrics_json={"reward_by_harness": {"mini": 0.5, "hello-agent": 0.25}})
    assert _harnesses({"name": "mini", "names": ["mini", "hello-agent"]}, [step]) == "hello-agent 0.25 · mini 0.50"
    assert _harnesses({"name": "mini", "names": ["mini", "hello-agent"]}, []) == "mini, hello-agent"
    assert _harnesses({"name": "codex"}, [step]) == "codex"
