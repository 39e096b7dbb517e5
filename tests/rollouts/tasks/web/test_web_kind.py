"""rollouts/tasks/web/benchmarks.py (WebVoyager and Online-Mind2Web files as tasks, the run's online check) and
rollouts/tasks/web/kind.py (how the web family describes and checks its tasks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from openforge.config import ForgeConfig
from openforge.errors import ConfigError, TaskError
from openforge.rollouts.tasks.format import TaskSpec
from openforge.rollouts.tasks.web.benchmarks import check_online, import_web_benchmark
from openforge.rollouts.tasks.web.kind import WebKind

VOYAGER = [{"web_name": "Allrecipes", "id": "Allrecipes--3", "ques": "Find a vegan lasagna.",
            "web": "https://www.allrecipes.com/"},
           {"web_name": "Wiki", "id": "Wiki--0", "ques": "Who wrote it?", "web": "https://en.wikipedia.org/"}]


def _voyager(tmp_path: Path) -> Path:
    (tmp_path / "WebVoyager_data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in VOYAGER))
    (tmp_path / "reference_answer.json").write_text(json.dumps(
        {"Allrecipes": {"answers": [{"id": 3, "ans": "Vegan Lasagna II"}]}}))
    return tmp_path


def test_webvoyager_tasks_are_online_only_unless_mapped_to_a_local_site(tmp_path: Path) -> None:
    tasks, online = import_web_benchmark("webvoyager", _voyager(tmp_path))
    assert online == 2 and [t["id"] for t in tasks] == ["webvoyager-Allrecipes--3", "webvoyager-Wiki--0"]
    first = tasks[0]
    assert first["family"]["online"] == {"benchmark": "webvoyager", "start_url": "https://www.allrecipes.com/",
                                         "website": "Allrecipes", "reference_answer": "Vegan Lasagna II"}
    assert first["instruction"].endswith("(Start at https://www.allrecipes.com/)") and "online-only" in first["tags"]
    sites = tmp_path / "sites.json"
    sites.write_text(json.dumps({"Wiki": {"site": "wiki", "path": "/", "params": {
        "articles": [{"slug": "a", "title": "A", "facts": {"author": "B"}}]}}}))
    tasks, online = import_web_benchmark("webvoyager", tmp_path, local_sites=sites)
    assert online == 1 and tasks[1]["family"]["gui"]["site"] == "wiki" and "local-copy" in tasks[1]["tags"]


def test_a_malformed_source_is_one_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="unknown web benchmark 'mind2web'"):
        import_web_benchmark("mind2web", tmp_path)
    (tmp_path / "tasks.json").write_text(json.dumps([{"task_id": "x"}]))
    with pytest.raises(TaskError, match="task 1 is not a online-mind2web task"):
        import_web_benchmark("online-mind2web", tmp_path / "tasks.json")


def test_online_tasks_need_the_internet_and_the_kind_says_which_they_are(tmp_path: Path) -> None:
    check_online([], allow_internet=False)
    check_online(["a"], allow_internet=True)
    with pytest.raises(ConfigError, match=r"task\(s\) a, b, c \(and 1 more\) are online-only"):
        check_online(["a", "b", "c", "d"], allow_internet=False)
    tasks = [TaskSpec.model_validate(t) for t in import_web_benchmark("webvoyager", _voyager(tmp_path))[0]]
    kind = WebKind()
    assert kind.describe(tasks[0]) == "online-web"
    with pytest.raises(ConfigError, match="online-only"):
        kind.check_run(tasks, ForgeConfig())
    config = ForgeConfig()
    config.sandbox.allow_internet = True
    kind.check_run(tasks, config)
