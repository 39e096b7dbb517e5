"""`forge tasks import webvoyager|online-mind2web`: the benchmarks' own task formats (files written here
in their published shapes) become online-only tasks graded by their named judge; a run refuses them
without `sandbox.allow_internet` (with it, tests/rollouts/tasks/web/test_tasks_web_online.py runs one in a container); the
NetworkPolicy's internet variant; and, offline, tasks mapped onto a builtin-web site run through the
real runner, proxy and sandbox, graded by the scripted WebJudge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from openforge.config import ForgeConfig, HarnessConfig, JudgeConfig
from openforge.errors import ConfigError
from openforge.forge_cli.main import app
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import TaskSpec, load_tasks
from openforge.rollouts.tasks.web.payload import WebPayload
from openforge.rollouts.tasks.selfcheck import _StandInHarness
from openforge.store import Store
from tests.helpers.gui_fixtures import needs_display, run_gui_task
from tests.helpers.screen_judge import _ScreenJudge, judge_url  # noqa: F401 - the scripted judge, as a fixture


def _web(task: TaskSpec) -> WebPayload:
    """The task's web part: its site (`gui`) or its live page (`online`)."""
    payload = task.payload(WebPayload)
    assert payload is not None
    return payload


WEBVOYAGER = [  # data/WebVoyager_data.jsonl's shape (github:MinorJerry/WebVoyager)
    {"web_name": "Allrecipes", "id": "Allrecipes--0", "ques": "Provide a recipe for vegetarian lasagna.",
     "web": "https://www.allrecipes.com/"},
    {"web_name": "BBC News", "id": "BBC News--3", "ques": "Find the latest article about climate.",
     "web": "https://www.bbc.com/news"},
]
ANSWERS = {"Allrecipes": {"notice": "", "answers": [{"id": 0, "type": "possible", "ans": "'Vegetarian Four Cheese Lasagna'"}]}}
MIND2WEB = [  # Online-Mind2Web's task JSON shape (huggingface osunlp/Online-Mind2Web)
    {"task_id": "fb7b4f784cfde003e2548fdf4e8d6b4f", "confirmed_task": "Open the Colour page and press the red button.",
     "website": "https://colours.example.org/", "reference_length": 3, "level": "easy"},
    {"task_id": "0a1b2c3d", "confirmed_task": "Find a 2-bed flat under $2000.", "website": "https://flats.example.com/",
     "reference_length": 9, "level": "hard"},
]


def _import(*args: str) -> str:
    result = CliRunner().invoke(app, ["tasks", "import", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_webvoyager_tasks_import_as_online_only_tasks_with_its_judge(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "WebVoyager_data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in WEBVOYAGER))
    (data / "reference_answer.json").write_text(json.dumps(ANSWERS))
    out = _import("webvoyager", str(data / "WebVoyager_data.jsonl"), "--out", str(tmp_path / "wv.jsonl"))
    assert "2 task(s) imported" in out and "2 online-only" in out
    first, second = load_tasks(tmp_path / "wv.jsonl")
    assert (first.id, second.id) == ("webvoyager-Allrecipes--0", "webvoyager-BBC-News--3")
    assert first.judge is not None and first.judge.name == "webvoyager" and first.judge.shows_screenshots
    assert _web(first).online is not None
    assert _web(first).online.start_url == "https://www.allrecipes.com/"  # type: ignore[union-attr]
    assert _web(first).online.reference_answer == "'Vegetarian Four Cheese Lasagna'"  # type: ignore[union-attr]
    assert _web(second).online.reference_answer == ""  # type: ignore[union-attr]
    assert first.instruction.startswith("Provide a recipe") and "https://www.allrecipes.com/" in first.instruction
    assert _web(first).gui is None and "online-only" in first.tags


def test_online_mind2web_tasks_import_with_webjudge_and_map_onto_local_sites(tmp_path: Path) -> None:
    (tmp_path / "tasks.json").write_text(json.dumps(MIND2WEB))
    sites = {"https://colours.example.org/": {"site": "colour", "params": {"order": ["red", "green", "blue", "yellow"]}}}
    (tmp_path / "sites.json").write_text(json.dumps(sites))
    out = _import("online-mind2web", str(tmp_path / "tasks.json"), "--out", str(tmp_path / "om2w.jsonl"),
                  "--local-sites", str(tmp_path / "sites.json"))
    assert "1 online-only" in out and "1 on local sites" in out
    local, online = load_tasks(tmp_path / "om2w.jsonl")
    assert local.judge.name == online.judge.name == "webjudge"
    assert (local.difficulty, online.difficulty) == ("easy", "hard")
    site = _web(local).gui
    assert _web(local).online is None and site is not None and site.site == "colour" and "local-copy" in local.tags
    assert local.instruction == MIND2WEB[0]["confirmed_task"]
    page = _web(online).online
    assert page is not None and page.reference_length == 9 and _web(online).gui is None


@pytest.mark.parametrize(("fmt", "content", "message"), [
    ("webvoyager", '{"web_name": "A", "ques": "q", "web": "https://a.example/"}\n', "task 1 is not a webvoyager task"),
    ("webvoyager", "not json\n", "cannot read WebVoyager tasks"),
    ("online-mind2web", '{"task_id": "x"}', "want a JSON list"),
    ("online-mind2web", '[{"task_id": "x", "confirmed_task": "q", "website": "ftp://a/"}]', "not an http(s) URL"),
    ("webarena", "[]", "unknown import format 'webarena'"),
])
def test_a_malformed_source_is_one_clear_line(tmp_path: Path, fmt: str, content: str, message: str) -> None:
    (tmp_path / "src").write_text(content)
    result = CliRunner().invoke(app, ["tasks", "import", fmt, str(tmp_path / "src"), "--out", str(tmp_path / "o.jsonl")])
    assert result.exit_code != 0 and message in result.output and "Traceback" not in result.output, result.output


@pytest.mark.parametrize(("site", "message"), [
    ({"site": "wiki"}, "bad params for site wiki: 'articles' is missing"),  # was "unknown site 'wiki' (known: ..., wiki)"
    ({"site": "wikipedia"}, "unknown site 'wikipedia' (known: booking, colour"),
])
def test_a_local_site_map_names_what_is_wrong_with_its_site(tmp_path: Path, site: dict, message: str) -> None:
    (tmp_path / "tasks.json").write_text(json.dumps(MIND2WEB))
    (tmp_path / "sites.json").write_text(json.dumps({"https://colours.example.org/": site}))
    result = CliRunner().invoke(app, ["tasks", "import", "online-mind2web", str(tmp_path / "tasks.json"), "--out",
                                      str(tmp_path / "o.jsonl"), "--local-sites", str(tmp_path / "sites.json")])
    assert result.exit_code != 0 and message in result.output and "Traceback" not in result.output, result.output


async def test_a_run_refuses_online_only_tasks_without_allow_internet(tmp_path: Path, store: Store) -> None:
    (tmp_path / "tasks.json").write_text(json.dumps(MIND2WEB))
    _import("online-mind2web", str(tmp_path / "tasks.json"), "--out", str(tmp_path / "om2w.jsonl"))
    tasks = load_tasks(tmp_path / "om2w.jsonl")
    runner = RolloutRunner(store, config=ForgeConfig(), proxy_url="http://127.0.0.1:9", harness=_StandInHarness({}, {}))
    run = store.create_run(kind="check")
    with pytest.raises(ConfigError, match="set sandbox.allow_internet = true"):
        await runner.run(run.id, [RolloutSpec(t) for t in tasks])
    assert store.list_rollouts(run.id) == []  # refused before any rollout
    # `forge eval` refuses before it starts an engine: one line, an exit code; with the switch on, the
    # local backend (the default) refuses it at preflight: bubblewrap has no network but none or the host's
    for allow, message in (("false", "set sandbox.allow_internet = true"),
                           ("true", "a local sandbox cannot open the internet")):
        result = CliRunner().invoke(app, ["--set", f"sandbox.allow_internet={allow}", "eval", "--tasks",
                                          str(tmp_path / "om2w.jsonl")])
        assert result.exit_code != 0 and message in result.output and "Traceback" not in result.output, result.output


def test_the_network_policy_admits_the_public_web_only_with_allow_internet() -> None:
    from tests.helpers.kubernetes import _cluster_config

    from openforge.sandbox.k8s_manifests import sandbox_network_policy

    plain = sandbox_network_policy(_cluster_config().sandbox, proxy_port=8700)
    online = sandbox_network_policy(_cluster_config(allow_internet=True).sandbox, proxy_port=8700)
    assert online["spec"]["egress"][:2] == plain["spec"]["egress"] and len(plain["spec"]["egress"]) == 2
    [web] = online["spec"]["egress"][2:]
    assert web["ports"] == [{"protocol": "TCP", "port": 80}, {"protocol": "TCP", "port": 443}]
    [block] = web["to"]
    assert block["ipBlock"]["cidr"] == "0.0.0.0/0"
    for private in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"):  # the cluster, metadata
        assert private in block["ipBlock"]["except"]
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kubernetes_validate.validate(online, "1.30", strict=True)


@needs_display
def test_an_imported_task_on_a_local_site_runs_and_is_judged_by_webjudge(tmp_path: Path, tiny_vl_model: Path,
                                                                         store: Store, judge_url: str) -> None:  # noqa: F811
    """The offline path end to end: Online-Mind2Web's task mapped onto the colour site, one rollout of
    mini-gui (click, done) through the real runner, proxy and sandbox, graded by the scripted WebJudge
    only (no exact grader): it answers success only when shown exactly two screens, the rollout's
    screens before and after the click."""
    (tmp_path / "tasks.json").write_text(json.dumps(MIND2WEB[:1]))
    (tmp_path / "sites.json").write_text(json.dumps(
        {MIND2WEB[0]["website"]: {"site": "colour", "params": {"order": ["red", "green", "blue", "yellow"]}}}))
    _import("online-mind2web", str(tmp_path / "tasks.json"), "--out", str(tmp_path / "om2w.jsonl"),
            "--local-sites", str(tmp_path / "sites.json"))
    [task] = load_tasks(tmp_path / "om2w.jsonl")
    _ScreenJudge.seen.clear()
    ro, _ = run_gui_task(store, tiny_vl_model, ["click(0)", "done()"], task.id,
                         HarnessConfig(name="mini-gui", max_turns=3, max_tokens=8,
                                       extra_args=["--grid", "2x2", "--no-tools", "--max-side", "512"]),
                         judge=JudgeConfig(url=judge_url, model="webjudge-2"), task=task)
    assert (ro.status, ro.reward) == ("scored", 1.0), (ro.error, ro.verifier_output, ro.stdout)
    [seen] = _ScreenJudge.seen
    assert seen["body"]["messages"][1]["content"][0]["text"].startswith("# User Task\nOpen the Colour page")
    assert "Status:" in seen["body"]["messages"][0]["content"]
    [row] = store.list_judgements(rollout_id=ro.id)
    assert row.score == 1.0 and row.reply.endswith('Status: "success"')
