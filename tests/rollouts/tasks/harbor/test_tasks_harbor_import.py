"""`forge tasks import harbor` on what a public Harbor dataset holds beside its tasks (issue 44): tests that
download at grading time are flagged at import and the failed download is named when the reference scores
0; a dataset's registry.json is no task; an offline build failure names what failed."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path
from types import SimpleNamespace

from tests.helpers.paths import DATA
from openforge.config import ForgeConfig
from openforge.rollouts.tasks.format import TaskSpec, load_tasks, validate_tasks
from openforge.rollouts.tasks.harbor.image import _build_failure, import_harbor
from openforge.rollouts.tasks.selfcheck import check_solutions
from openforge.store import Store

DATA = DATA / "harbor"
# Terminal-Bench's usual test.sh: fetch uv, then pytest through it; offline the fetch fails and the rest
# ends in "command not found" lines and a 0, the cause far from the last line.
DOWNLOADING = """\
#!/bin/bash
curl -LsSf https://astral.invalid/uv/0.7.13/install.sh | sh
source $HOME/.local/bin/env
uv venv .tbench-testing
uv run pytest /tests/test_outputs.py -rA
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""


def _dataset(tmp_path: Path) -> Path:
    root = tmp_path / "dataset"
    shutil.copytree(DATA, root)
    (root / "hello-world" / "tests" / "test.sh").write_text(DOWNLOADING)
    (root / "registry.json").write_text('[{"name": "demo", "version": "1.0", "tasks": []}]')
    return root


def test_a_datasets_registry_json_is_no_task(tmp_path: Path) -> None:
    root = _dataset(tmp_path)
    assert validate_tasks(root) == []
    assert sorted(t.id for t in load_tasks(root)) == ["count-rows", "fix-greeting", "hello-world"]


def test_tests_that_download_at_grading_time_are_flagged_at_import(tmp_path: Path) -> None:
    root = _dataset(tmp_path)
    with (root / "count-rows" / "tests" / "test.sh").open("a") as f:  # a local service's URL is no download
        f.write("curl -s http://localhost:8080/health >/dev/null; curl -s http://db:5432/ || true\n")
    report = import_harbor(root)
    assert sorted(t["id"] for t in report.tasks) == ["count-rows", "fix-greeting", "hello-world"]
    assert report.notes == [("hello-world", "its tests download at grading time (tests/test.sh line 2: curl -LsSf "
                                            "https://astral.invalid/uv/0.7.13/install.sh | sh): an offline sandbox "
                                            "cannot grade it")]


async def test_a_reference_that_scores_0_for_a_failed_download_names_it(tmp_path: Path, store: Store) -> None:
    (record,) = [t for t in import_harbor(_dataset(tmp_path)).tasks if t["id"] == "hello-world"]
    [problem] = await check_solutions(store, ForgeConfig(), [TaskSpec.model_validate(record)])
    assert problem.message.startswith("the reference solution scores 0 < pass_threshold 1: ")
    assert "the tests reached for the network, offline: curl: (6) Could not resolve host: astral.invalid" \
        in problem.message, problem.message


def _failure(output: str, code: int) -> str:
    log = [{"stream": "Step 1/2 : FROM alpine:3\n"}, {"stream": "Step 2/2 : RUN apt-get update\n"},
           {"stream": output + "\n"}, {"errorDetail": {"code": code}}]
    exc = SimpleNamespace(build_log=log, msg="The command returned a non-zero code")
    return _build_failure([(1, "FROM", "alpine:3"), (2, "RUN", "apt-get update")], exc)


def test_an_offline_build_failure_names_what_failed() -> None:
    """A base without apt-get is not "no network"; an apt-get that cannot reach its mirror is."""
    missing = _failure("/bin/sh: apt-get: not found", 127)
    assert "no network" not in missing
    assert missing.startswith("environment/Dockerfile line 2: RUN apt-get update failed in forge's offline build: "
                              "a command it runs is not in the base image: exit 127; last output: /bin/sh: apt-get: "
                              "not found"), missing
    offline = _failure("W: Failed to fetch http://deb.debian.org/debian/dists/bookworm/InRelease  Temporary failure "
                       "resolving 'deb.debian.org'", 100)
    assert "failed in forge's offline build (no network): exit 100; last output: W: Failed to fetch" in offline
    other = _failure("make: *** [all] Error 2", 2)
    assert "failed in forge's offline build: exit 2; last output: make: *** [all] Error 2" in other
    assert "no network" not in other
