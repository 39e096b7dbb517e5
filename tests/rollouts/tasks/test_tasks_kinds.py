"""Task families as plugins (rollouts/tasks/kinds.py): one place decides a task's family, the shipped families
claim their own tasks, and a family installed by another package (entry point `openforge.task_kinds`) is found
and asked like the shipped ones."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from openforge.errors import TaskError
from openforge.rollouts.tasks import kinds
from openforge.rollouts.tasks.format import TaskSpec, load_tasks
from openforge.rollouts.tasks.kinds import PLAIN, TaskKind, get_kind, kind_names, kind_of, kinds_of
from openforge.runs.plan import task_kind

PLUGIN = '''
from openforge.rollouts.tasks.kinds import TaskKindBase

class RiddleKind(TaskKindBase):
    name = "riddles"

    def claims(self, task):
        return "riddle" in task.tags

    def describe(self, task):
        return "riddle"
'''


@pytest.fixture
def installed_family(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A package on sys.path whose dist-info declares a task family, as `pip install` would leave it."""
    (tmp_path / "riddles_family.py").write_text(PLUGIN)
    info = tmp_path / "riddles_family-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: riddles-family\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{kinds.ENTRY_POINT_GROUP}]\nriddles = riddles_family:RiddleKind\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    kinds._claim_order.cache_clear()
    yield
    kinds._claim_order.cache_clear()
    kinds._loaded.pop("riddles", None)


def test_every_shipped_family_is_a_task_kind_and_plain_comes_last() -> None:
    names = kind_names()
    assert names[:6] == ["harbor", "osworld", "claweval", "desktop", "web", "gsm8k"] and names[-1] == PLAIN.name
    assert all(isinstance(get_kind(n), TaskKind) for n in names)
    with pytest.raises(TaskError, match="unknown task family 'nosuch'"):
        get_kind("nosuch")


def test_a_tasks_family_is_decided_from_its_fields_in_one_place() -> None:
    web = load_tasks("builtin-web")[0]
    plain = load_tasks("builtin")[0]
    assert (kind_of(web).name, kind_of(plain).name) == ("web", "plain")
    assert (task_kind(web), task_kind(plain)) == ("gui", "exact")  # the plan asks the family to describe it
    judged = TaskSpec(id="j", instruction="say hi", judge={"rubric": "says hi"})
    assert kind_of(judged) is PLAIN and task_kind(judged) == "judge"
    groups = kinds_of([plain, web, plain])
    assert {name: [t.id for t in tasks] for name, (_, tasks) in groups.items()} == {
        "plain": [plain.id, plain.id], "web": [web.id]}


def test_a_family_from_another_package_claims_its_tasks(installed_family: None) -> None:
    assert "riddles" in kind_names() and kind_names()[-1] == PLAIN.name
    riddle = TaskSpec(id="r", instruction="what has keys but no locks?", expect_answer={"words": "a piano"},
                      tags=["riddle"])
    assert kind_of(riddle).name == "riddles" and task_kind(riddle) == "riddle"
    assert kind_of(riddle.model_copy(update={"tags": []})) is PLAIN
