"""rollouts/tasks/claweval/kind.py as `forge tasks import claweval` calls it: the checkout's tasks written as task
folders, what cannot run refused with its reason, and a summary of which tasks keep ClawEval's own grader."""

from __future__ import annotations

from pathlib import Path

from openforge.rollouts.tasks.claweval.kind import ClawEvalKind
from openforge.rollouts.tasks.format import load_tasks
from tests.helpers.paths import DATA


def test_import_writes_the_runnable_tasks_and_names_the_rest(tmp_path: Path) -> None:
    result = ClawEvalKind().import_tasks(str(DATA / "claweval"), str(tmp_path / "out"), fmt="claweval",
                                         options={"reward": "claweval"})
    assert len(result.tasks) == 2 and result.written_to == str(tmp_path / "out")
    refused = dict(result.refused)
    assert refused["N003_web_lookup"].startswith("online-only: ")
    assert refused["N004_fix_script"].startswith("unsupported: ") and len(refused) == 4
    assert "6 task(s): 2 imported" in result.summary and "1 imported with ClawEval's own grader.py" in result.summary
    assert "its task score is the reward" in result.summary
    loaded = load_tasks(tmp_path / "out")
    assert sorted(t.id for t in loaded) == sorted(t["id"] for t in result.tasks)
    judged = ClawEvalKind().import_tasks(str(DATA / "claweval"), str(tmp_path / "judged"), fmt="claweval",
                                         options={"reward": "judge"})
    assert "its scores beside forge's judge's reward" in judged.summary
