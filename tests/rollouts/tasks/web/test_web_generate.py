"""rollouts/tasks/web/generate.py: the `builtin-web` task set is data its generator writes (WEB_TASKS_DIR), in the
`family` form; lines of the older form (a top-level `gui`) load into the same tasks."""

from __future__ import annotations

import json
import re
from pathlib import Path

from openforge.rollouts.tasks.format import LEGACY_KEYS, load_tasks
from openforge.rollouts.tasks.kinds import kind_of
from openforge.rollouts.tasks.web import WEB_TASKS_DIR
from openforge.rollouts.tasks.web.generate import answer, web_tasks, write


def test_the_builtin_web_set_is_written_in_the_new_form_and_its_older_lines_load_the_same(tmp_path: Path) -> None:
    text = (WEB_TASKS_DIR / "builtin-web.jsonl").read_text()
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert lines and all(line["family"]["kind"] == "web" and not set(line) & set(LEGACY_KEYS) for line in lines)
    assert write(tmp_path).read_text() == text  # the shipped file is what its generator writes
    older = tmp_path / "older.jsonl"  # the lines as they were written before `family`
    older.write_text("".join(json.dumps({**{k: v for k, v in line.items() if k != "family"},
                                         "gui": line["family"]["gui"]}) + "\n" for line in lines))
    shipped = load_tasks("builtin-web")
    assert load_tasks(older) == shipped
    assert all(kind_of(t).describe(t) == "gui" for t in shipped)


def test_each_solution_answers_what_its_task_expects() -> None:
    with_answers = [t for t in web_tasks() if "expect_answer" in t]
    assert len(with_answers) >= 4
    for task in with_answers:
        [expected] = task["expect_answer"].values()
        assert answer(f"{expected:g}" if isinstance(expected, float) else str(expected)) in task["solution"], task["id"]


def test_each_colour_click_lands_on_its_colours_quadrant() -> None:
    clicks = [t for t in web_tasks() if t["id"].startswith("gui-colour-click-")]
    assert len(clicks) == 4
    for task in clicks:
        colour, order = task["gui"]["expect_state"]["clicks"][0], task["gui"]["params"]["order"]
        x, y = map(int, re.search(r" click (\d+) (\d+)", task["solution"]).groups())
        quadrant = (x >= 512) + 2 * (y >= 384)  # the site's 2x2 grid of 512x384 cells, reading order
        assert order[quadrant] == colour, task["id"]
