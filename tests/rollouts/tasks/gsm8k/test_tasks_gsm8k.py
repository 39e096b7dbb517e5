"""The gsm8k family (rollouts/tasks/gsm8k/): GSM8K-style lines imported by `forge tasks import gsm8k`, graded by
the exact final number through the runner; a reply that only holds the number among others scores 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from openforge.forge_cli.main import app
from openforge.rollouts.runner.runner import RolloutSpec
from openforge.rollouts.tasks.format import load_tasks
from openforge.rollouts.tasks.grading import answer_matches
from openforge.rollouts.tasks.kinds import PLAIN, get_kind, kind_names, kind_of
from openforge.store import Store
from tests.helpers.runner import ShellHarness, _runner

NATALIA = {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                       "How many clips did Natalia sell altogether in April and May?",
           "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
                     "altogether in April and May.\n#### 72"}
LINES = [
    json.dumps(NATALIA),
    json.dumps({"question": "A farm has 1,200 hens and buys 400 more. How many hens?", "answer": "1200+400\n#### 1,600"}),
    "",
    json.dumps({"question": "Half of 1?", "answer": "1/2\n#### 0.5"}),
    json.dumps({"question": "No final line?", "answer": "It is 5."}),                  # 5: refused
    json.dumps({"question": "Units?", "answer": "#### 72 apples"}),                   # 6: refused
    json.dumps({"answer": "#### 3"}),                                                 # 7: refused
    "[1, 2]",                                                                         # 8: refused
    "{not json",                                                                      # 9: refused
    json.dumps({"question": "Too big?", "answer": f"#### {2 ** 60}"}),                # 10: refused
]


def _import(tmp_path: Path, lines: list[str] = LINES) -> tuple[object, Path]:
    src, out = tmp_path / "test.jsonl", tmp_path / "out" / "gsm8k.jsonl"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return CliRunner().invoke(app, ["tasks", "import", "gsm8k", str(src), "--out", str(out)]), out


def test_forge_tasks_import_gsm8k_writes_exact_number_tasks_and_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    result, out = _import(tmp_path)
    assert result.exit_code == 0, result.output
    assert f"9 question(s): 3 imported to {out}, 6 refused" in result.output
    for n, why in [(5, "answer: no final '#### N' line"), (6, "answer: no final '#### N' line"), (7, "question: missing"),
                   (8, "a JSON list, not an object"), (9, "bad JSON"), (10, f"answer: {2 ** 60} cannot be checked exactly")]:
        assert f"test.jsonl:{n}: {why}" in result.output
    tasks = load_tasks(out)
    assert [(t.id, t.expect_answer.number) for t in tasks] == [("gsm8k-00001", 72), ("gsm8k-00002", 1600),
                                                               ("gsm8k-00004", 0.5)]
    assert all("<<" not in t.instruction and "####" not in t.instruction for t in tasks)  # the worked answer is hidden
    assert {kind_of(t).name for t in tasks} == {PLAIN.name}  # once imported, plain exact-answer tasks
    assert "gsm8k" in kind_names() and get_kind("gsm8k").import_help


def test_an_import_that_reads_nothing_fails_and_an_unknown_format_names_the_families(tmp_path: Path) -> None:
    result, _ = _import(tmp_path, ["{not json"])
    assert result.exit_code == 1 and "none of its 1 task(s) could be imported" in result.output
    bad = CliRunner().invoke(app, ["tasks", "import", "gsm9k", str(tmp_path)])
    assert bad.exit_code != 0 and "unknown import format 'gsm9k'" in bad.output and "gsm8k" in bad.output


def test_an_out_the_task_loader_would_not_read_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """`--out tasks` (no .jsonl) wrote a file no `forge` command could then load as a task set."""
    src = tmp_path / "test.jsonl"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["tasks", "import", "gsm8k", str(src), "--out", str(tmp_path / "tasks")])
    assert result.exit_code == 1 and "give it a .jsonl name" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "tasks").exists()


@pytest.mark.parametrize(("reply", "right"), [
    ("72", True), ("72.0", True), ("+72", True), ("**72**", True), ("72.", True),
    ("73", False), ("48 + 24 = 72", False), ("The answer is 72", False), ("72 72", False), ("24\n72", False),
    ("72 clips", False), ("seventy-two", False), ("７２", False), ("", False),
])
def test_the_reward_is_the_exact_final_number_never_a_substring(tmp_path: Path, reply: str, right: bool) -> None:
    _, out = _import(tmp_path, [json.dumps(NATALIA)])
    [task] = load_tasks(out)
    assert answer_matches(task.expect_answer, reply) is right


async def test_imported_tasks_are_graded_by_the_runner(tmp_path: Path, store: Store) -> None:
    _, out = _import(tmp_path, [json.dumps(NATALIA)])
    [task] = load_tasks(out)
    run = store.create_run(kind="eval")
    got = {}
    for reply in ("72", "48 + 24 = 72", "72 clips"):  # what the agent leaves as its final answer
        harness = ShellHarness(f"mkdir -p .forge && printf '%s\\n' '{reply}' > .forge/answer.txt")
        [ro] = await _runner(store, harness).run(run.id, [RolloutSpec(task, len(got))])
        got[reply] = (ro.status, ro.reward)
    assert got == {"72": ("scored", 1.0), "48 + 24 = 72": ("scored", 0.0), "72 clips": ("scored", 0.0)}
