"""`TaskSpec.family` (rollouts/tasks/format.py): a family's own part of a task, keyed by `kind` (each model in its
family's folder). Task files and stored records of the older form, with top-level `harbor`, `osworld`, `gui`, ...,
load into it; the importers write the new form, which reloads identically."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.helpers.paths import DATA
from openforge.rollouts.tasks.claweval.importer import import_claweval
from openforge.rollouts.tasks.claweval.payload import ClawEvalPayload
from openforge.rollouts.tasks.desktop.payload import DesktopPayload
from openforge.rollouts.tasks.format import LEGACY_KEYS, NAMED_SETS, TaskSpec, load_tasks
from openforge.rollouts.tasks.harbor.payload import HarborPayload
from openforge.rollouts.tasks.kinds import PLAIN, kind_of
from openforge.rollouts.tasks.osworld.payload import OSWorldPayload
from openforge.rollouts.tasks.web.payload import WebPayload

PLAIN_TASK = {"id": "t", "instruction": "do it"}
TESTS = {"files": {"test.sh": "echo 1 > /logs/verifier/reward.txt"}, "workdir": "/app"}
EVALUATOR = {"funcs": ["infeasible"]}
DESKTOP = {"apps": ["xedit"], "start": "xedit &"}


def _older_form(task: TaskSpec) -> dict:
    """The record `task` was stored as before `family`: its payload's parts as top-level keys, null for the rest
    (a stored record's model_dump wrote every field)."""
    record = task.to_record()
    family = record.pop("family")
    record.update({key: None for key in LEGACY_KEYS})
    if family is not None:
        by_name = {(kind, name): key for key, (kind, name) in LEGACY_KEYS.items()}
        record.update({by_name[family["kind"], name]: value for name, value in family.items() if name != "kind"})
    return record


@pytest.mark.parametrize("name", [*NAMED_SETS, "tests/data/harbor"])
def test_every_shipped_set_loads_from_either_form_into_the_same_tasks(name: str) -> None:
    tasks = load_tasks(DATA.parent.parent / name if name.startswith("tests/") else name)
    assert tasks
    for task in tasks:
        assert TaskSpec.model_validate(_older_form(task)) == task
        assert TaskSpec.model_validate(task.to_record()) == task
        kind = kind_of(task)
        # a family's task carries its payload, a plain one none
        assert (task.family is None) == (kind is PLAIN), task.id
        assert task.family is None or task.family.kind == kind.name


@pytest.mark.parametrize(("older", "payload", "parts"), [
    ({"harbor": TESTS}, HarborPayload, {"tests"}),
    ({"harbor": TESTS,
      "harbor_steps": {"steps": [{"name": "one", "instruction": "a", "tests": TESTS, "time_limit_s": 60}]}},
     HarborPayload, {"tests", "steps"}),
    ({"osworld": EVALUATOR, "desktop": DESKTOP}, OSWorldPayload, {"evaluator", "desktop"}),
    ({"desktop": DESKTOP, "verifier": "true"}, DesktopPayload, {"desktop"}),
    ({"gui": {"site": "colour", "expect_state": {"clicks": ["red"]}}}, WebPayload, {"gui"}),
    ({"online": {"benchmark": "webvoyager", "start_url": "https://example.org/", "website": "e"}, "judge": {}},
     WebPayload, {"online"}),
])
def test_each_familys_older_keys_move_into_its_payload(older: dict, payload: type, parts: set[str]) -> None:
    task = TaskSpec.model_validate({**PLAIN_TASK, **older})
    got = task.payload(payload)
    assert got is not None and {n for n in type(got).model_fields if getattr(got, n) is not None} == parts | {"kind"}
    new_form = {**PLAIN_TASK, **{k: v for k, v in older.items() if k not in LEGACY_KEYS},
                "family": {"kind": got.kind, **{LEGACY_KEYS[k][1]: v for k, v in older.items() if k in LEGACY_KEYS}}}
    assert TaskSpec.model_validate(new_form) == task
    assert kind_of(task).name == got.kind
    assert all(task.payload(other) is None for other in (HarborPayload, OSWorldPayload, DesktopPayload, WebPayload)
               if other is not payload)


@pytest.mark.parametrize(("record", "message"), [
    ({"harbor": TESTS, "gui": {"site": "colour", "expect_state": {"clicks": ["red"]}}}, "a task is of one family"),
    ({"desktop": DESKTOP, "gui": {"site": "colour"}, "verifier": "true"}, "a desktop task has no site"),
    ({"gui": {"site": "colour"}, "online": {"benchmark": "webvoyager", "start_url": "https://e.org/", "website": "e"},
      "verifier": "true"}, "not both"),
    ({"family": {"kind": "harbor", "tests": TESTS}, "osworld": EVALUATOR}, "write one form"),
    ({"family": {"kind": "harbor"}}, "tests or steps"),
    ({"family": {"kind": "chess", "board": "8/8"}, "verifier": "true"}, "unknown task family 'chess'"),
])
def test_a_task_of_two_families_or_none_is_refused(record: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        TaskSpec.model_validate({**PLAIN_TASK, **record})


def test_an_import_writes_the_new_form_and_reloads_identically() -> None:
    report = import_claweval(DATA / "claweval")
    assert report.tasks
    for record in report.tasks:
        assert not set(record) & set(LEGACY_KEYS)
        task = TaskSpec.model_validate(record)
        assert TaskSpec.model_validate(json.loads(json.dumps(task.to_record()))) == task
    assert any(TaskSpec.model_validate(r).payload(ClawEvalPayload) is not None for r in report.tasks)
