"""Task families as plugins (rollouts/tasks/kinds.py): one place decides a task's family, the shipped families
claim their own tasks, and a family installed by another package (entry point `openforge.task_kinds`) is found
and asked like the shipped ones: its payload model validates its tasks' `family` and round-trips through the
store, its tasks are dispatched by `kind`, and its importer (with an option of its own) is `forge tasks import`'s.
A `kind` no installed family has is one clear problem naming it and how to install it."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from openforge.errors import TaskError
from openforge.forge_cli.main import app
from openforge.rollouts.tasks import kinds, registry
from openforge.rollouts.tasks.format import TaskSpec, load_tasks, validate_tasks
from openforge.rollouts.tasks.kinds import PLAIN, TaskKind, get_kind, importer_of, kind_names, kind_of, kinds_of
from openforge.runs.plan import task_kind
from openforge.store import Store

PLUGIN = '''
from pathlib import Path
from typing import Literal

from pydantic import Field

from openforge.rollouts.tasks.importing import ImportOption, ImportResult, write_jsonl
from openforge.rollouts.tasks.kinds import TaskKindBase
from openforge.rollouts.tasks.payload import FamilyPayload


class RiddlePayload(FamilyPayload):
    kind: Literal["riddles"] = "riddles"
    answer: str = Field(min_length=1)
    hint: str | None = None

    @property
    def exact_graded(self):
        return True


class RiddleKind(TaskKindBase):
    name = "riddles"
    payload_model = RiddlePayload
    import_formats = ("riddles",)
    import_help = "a riddle book, 'question? answer' a line"
    import_source = "a riddle book"
    import_options = (ImportOption("hint", "a hint given with every riddle"),)

    def claims(self, task):  # a task without a payload, tagged as one of its own
        return "riddle" in task.tags

    def describe(self, task):
        return "riddle"

    async def grade_exact(self, grader, sb, ro, task, answer, site=None, *, services=None):
        return float(answer.strip().lower() == task.payload(RiddlePayload).answer), "riddle answered", None

    def import_tasks(self, src, out, *, fmt, options):
        tasks, refused = [], []
        for n, line in enumerate(Path(src).read_text().splitlines(), 1):
            question, mark, answer = line.partition("?")
            if not mark or not answer.strip():
                refused.append((f"{src}:{n}", "no 'question? answer'"))
                continue
            tasks.append({"id": f"riddle-{n}", "instruction": question + "?",
                          "family": {"kind": "riddles", "answer": answer.strip(), "hint": options["hint"]}})
        path = write_jsonl(tasks, out or "riddles.jsonl") if tasks else None
        return ImportResult(tasks=tasks, written_to=str(path), refused=refused,
                            summary=f"{src}: {len(tasks)} riddle(s) imported to {path}")
'''
RIDDLE = {"id": "piano", "instruction": "What has keys but opens no locks?",
          "family": {"kind": "riddles", "answer": "a piano", "hint": "music"}}


@pytest.fixture
def installed_family(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A package on sys.path whose dist-info declares a task family, as `pip install` would leave it."""
    (tmp_path / "riddles_family.py").write_text(PLUGIN)
    info = tmp_path / "riddles_family-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: riddles-family\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\nriddles = riddles_family:RiddleKind\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    kinds._claim_order.cache_clear()
    yield
    kinds._claim_order.cache_clear()
    kinds._loaded.pop("riddles", None)
    registry._installed.pop("riddles", None)
    sys.modules.pop("riddles_family", None)


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


async def test_a_family_from_another_package_brings_its_payload(installed_family: None, store: Store,
                                                               tmp_path: Path) -> None:
    """Its payload model validates `family`, its tasks are its own by `kind`, and a task reloads from the store's
    JSON into the same task of the same family."""
    book = tmp_path / "riddles.jsonl"
    book.write_text(json.dumps(RIDDLE) + "\n" + json.dumps({**RIDDLE, "id": "blank", "family": {"kind": "riddles"}})
                    + "\n")
    problems = [str(p) for p in validate_tasks(book)]
    assert len(problems) == 1 and "[blank]: family.riddles.answer: missing (required)" in problems[0], problems
    book.write_text(json.dumps(RIDDLE) + "\n")
    [task] = load_tasks(book)
    kind = kind_of(task)
    assert (kind.name, type(task.family).__name__, task_kind(task)) == ("riddles", "RiddlePayload", "riddle")
    assert task.exact_graded and task.to_record()["family"] == RIDDLE["family"]
    assert await kind.grade_exact(None, None, None, task, "A piano") == (1.0, "riddle answered", None)  # type: ignore[arg-type]
    run = store.create_run(kind="eval")
    store.add_tasks(run.id, [task.to_record()])
    [row] = store.list_tasks(run.id)
    again = TaskSpec.model_validate(json.loads(json.dumps(row.spec_json)))
    assert again == task and kind_of(again) is kind


def test_a_stored_task_of_a_family_not_installed_names_it_and_how_to_install_it(tmp_path: Path) -> None:
    """Never a traceback, never the payload dropped: the task is refused, naming the family and its entry point."""
    book = tmp_path / "riddles.jsonl"
    book.write_text(json.dumps(RIDDLE) + "\n")
    with pytest.raises(ValidationError, match="unknown task family 'riddles'") as err:
        TaskSpec.model_validate(RIDDLE)
    assert "pip install" in str(err.value) and registry.ENTRY_POINT_GROUP in str(err.value)
    result = CliRunner().invoke(app, ["tasks", "validate", str(book)])
    assert result.exit_code == 1
    assert f"{book}:1 [piano]: family: unknown task family 'riddles' (known: harbor," in result.output
    assert "entry-point group openforge.task_kinds" in result.output and "Traceback" not in result.output
    with pytest.raises(TaskError, match="unknown task family 'riddles'"):
        load_tasks(book)


def test_forge_tasks_import_runs_an_installed_familys_importer_with_its_own_option(installed_family: None,
                                                                                     tmp_path: Path) -> None:
    """The command is built from the families installed when forge starts: a fresh `forge` lists the format and
    the option in its help and runs the importer with it; an unknown format still names every format."""
    assert importer_of("riddles").name == "riddles"
    src = tmp_path / "book.txt"
    src.write_text("What has keys but opens no locks? a piano\nno riddle here\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    calls = [["tasks", "import", "--help"],
             ["tasks", "import", "riddles", str(src), "--out", "r.jsonl", "--hint", "music"],
             ["tasks", "import", "riddle", str(src)]]
    script = ("import json, sys; from typer.testing import CliRunner; from openforge.forge_cli.main import app\n"
              "runs = [CliRunner().invoke(app, args) for args in json.loads(sys.argv[1])]\n"
              "print(json.dumps([[r.exit_code, r.stdout, r.stderr] for r in runs]))")
    ran = subprocess.run([sys.executable, "-c", script, json.dumps(calls)], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=120)  # one fresh forge process: it reads the installed families
    assert ran.returncode == 0, ran.stderr
    (_, shown, _), (code, out, err), (unknown_code, _, unknown) = json.loads(ran.stdout)
    assert "riddles (a riddle book, 'question? answer' a line)" in " ".join(shown.split()) and "--hint" in shown
    assert code == 0, err
    assert f"{src}:2: no 'question? answer'" in err and f"{src}: 1 riddle(s) imported to r.jsonl" in out
    [task] = load_tasks(tmp_path / "r.jsonl")
    assert task.to_record()["family"] == RIDDLE["family"] and kind_of(task).name == "riddles"
    assert unknown_code == 1 and "unknown import format 'riddle': harbor, osworld, claweval" in unknown
    assert " ".join(unknown.split()).endswith("gsm8k, riddles")


def test_kinds_import_nothing_of_the_runner() -> None:
    """The runner imports kinds.py; the runner and grader a kind is handed are protocols declared there."""
    tree = ast.parse(Path(kinds.__file__).read_text(encoding="utf-8"))
    names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert names and not [n for n in names if n.startswith("openforge.rollouts.runner")]
