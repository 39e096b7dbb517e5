"""The `builtin-web` task set: every task's reference solution (driving chromium with xdotool inside a
real sandbox) scores exactly 1 and hostile answers score 0, through the real runner; the site's state
is graded on the host, so what the agent writes inside the sandbox (a forged state file, a request to
an endpoint the site does not have, a grader's line as its answer) does not pass; a wrong action
(the right item and one more) fails."""

from __future__ import annotations

import shutil

import pytest

from openforge.config import ForgeConfig
from openforge.store import Store
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.selfcheck import HOSTILE_ANSWERS, _StandInHarness, check_solutions
from openforge.rollouts.tasks.format import TaskSpec, load_tasks, validate_tasks
from openforge.rollouts.tasks.web.sites import make_site
from openforge.rollouts.tasks.web.payload import WebPayload
from openforge.rollouts.tasks.web.spec import GuiTask
from openforge.sandbox.gui import find_chromium
from openforge.sandbox.local import bwrap_usable
from tests.helpers.required import requires


def _web(task: TaskSpec) -> WebPayload:
    """The task's web part: its site (`gui`) or its live page (`online`)."""
    payload = task.payload(WebPayload)
    assert payload is not None
    return payload


TASKS = load_tasks("builtin-web")
BY_ID = {t.id: t for t in TASKS}
MISSING = [n for n, ok in (("chromium", find_chromium()), ("Xvfb", shutil.which("Xvfb")),
                           ("xdotool", shutil.which("xdotool")), ("bwrap", bwrap_usable())) if not ok]
needs_gui = requires("chromium", f"needs {', '.join(MISSING)} (apt-get install chromium xvfb xdotool bubblewrap)"
                     if MISSING else None)


def test_the_set_covers_the_site_families_and_is_valid() -> None:
    assert validate_tasks("builtin-web") == []
    sites = {_web(t).gui.site for t in TASKS}  # type: ignore[union-attr]
    assert sites == {"shop", "wiki", "booking", "settings", "editor-prefs", "notes", "colour"}
    assert all(_web(t).gui is not None and t.solution for t in TASKS)
    modes = {_web(t).gui.mode for t in TASKS}  # type: ignore[union-attr]
    assert modes == {"kiosk", "app"}  # web pages and desktop-style windows
    colour = [t for t in TASKS if "gui-colour" in t.tags]
    assert len(colour) == 8 and all(t.expect_answer or _web(t).exact_graded for t in colour)


def test_a_task_a_do_nothing_agent_would_pass_is_refused() -> None:
    with pytest.raises(ValueError, match="already holds"):
        GuiTask(site="colour", expect_state={"clicks": []})
    with pytest.raises(ValueError, match="no state for"):
        GuiTask(site="colour", expect_state={"score": 1})
    with pytest.raises(ValueError, match="unknown site"):
        GuiTask(site="bank")


def test_sites_change_state_only_through_their_actions() -> None:
    shop = make_site("shop", _web(BY_ID["web-shop-cheapest-mug"]).gui.params)  # type: ignore[union-attr]
    assert shop.handle("POST", "/cart/add", {"sku": "nope"})[0] == 400
    assert shop.handle("POST", "/state", {"cart": "mug-red"})[0] == 404
    assert shop.handle("GET", "/cart/add", {"sku": "mug-red"})[0] == 404
    assert shop.state() == {"cart": []}
    assert shop.handle("POST", "/cart/add", {"sku": "mug-red"})[0] == 303
    assert shop.state() == {"cart": ["mug-red"]}


async def _run(store: Store, tasks: list[TaskSpec], scripts: dict[str, str] | None = None,
               answers: dict[str, str] | None = None) -> dict[str, tuple[str, float | None, str]]:
    run = store.create_run(kind="check", name="gui tasks")
    runner = RolloutRunner(store, config=ForgeConfig(), proxy_url="http://127.0.0.1:9",
                           harness=_StandInHarness(scripts or {}, answers))
    out = await runner.run(run.id, [RolloutSpec(t) for t in tasks])
    return {t.id: (r.status, r.reward, r.verifier_output or r.error or "") for t, r in zip(tasks, out)}


@needs_gui
@pytest.mark.slow
async def test_every_reference_solution_scores_one_and_hostile_answers_zero(store: Store) -> None:
    """`forge tasks validate --run builtin-web`, with the do-nothing hostile answer only (each rollout
    starts chromium: ~4 min for two on 2 loaded cores; the command itself runs all six, docs/gui.md has
    its measured run, and the answer graders are those of the text tasks, tested with all six)."""
    import openforge.rollouts.tasks.selfcheck as selfcheck

    keep = {k: selfcheck.HOSTILE_ANSWERS[k] for k in ("empty",)}
    original = dict(selfcheck.HOSTILE_ANSWERS)
    selfcheck.HOSTILE_ANSWERS.clear()
    selfcheck.HOSTILE_ANSWERS.update(keep)
    try:
        problems = await check_solutions(store, ForgeConfig(), TASKS)
    finally:
        selfcheck.HOSTILE_ANSWERS.clear()
        selfcheck.HOSTILE_ANSWERS.update(original)
    assert problems == []
    [run] = [r for r in store.list_runs() if r.kind == "check"]
    rollouts = store.list_rollouts(run.id)
    assert len(rollouts) == len(TASKS) * 2 and all(r.status == "scored" for r in rollouts)
    assert {r.task_id: r.reward for r in rollouts if r.step == 0} == {t.id: 1.0 for t in TASKS}
    assert [r for r in rollouts if r.step > 0 and r.reward != 0.0] == []
    assert len(HOSTILE_ANSWERS) == 6


# An agent inside the sandbox that knows how grading works, and tries to pass without the GUI action.
FORGERIES = {
    # a state file wherever a grader might look, and the grader's own line as a "verifier" would print it
    "web-shop-cheapest-mug": "mkdir -p .forge && echo '{\"cart\": [\"mug-red\"]}' | tee state.json .forge/state.json "
                             "> $HOME/state.json; echo 'site state: ok' ; echo 'score: 1'",
    # requests to endpoints the site does not have, straight to its port (the site answers 404)
    "gui-colour-click-red": "\"$FORGE_PYTHON\" -c \"import urllib.request as u\n"
                            "for p in ('/state', '/admin/state', '/clicked'):\n"
                            "  try: u.urlopen(u.Request('http://127.0.0.1:8080'+p, data=b'clicks=red', method='PUT'))\n"
                            "  except Exception as e: print(p, e)\"",
    # the settings changed in a file beside the page, never through it
    "desktop-editor-prefs": "printf 'font_size=16\\nword_wrap=true\\n' > prefs.ini && ls /run/forge",
}


@needs_gui
async def test_forged_state_from_inside_does_not_pass(store: Store) -> None:
    tasks = [BY_ID[i] for i in FORGERIES]
    got = await _run(store, tasks, scripts=FORGERIES)
    for tid, (status, reward, output) in got.items():
        assert status == "scored" and reward == 0.0, (tid, status, reward, output)
        assert "site state: wrong" in output


@needs_gui
async def test_the_right_item_and_one_more_fails(store: Store) -> None:
    """The exact state, not a superset: adding the cheapest mug and another one is wrong. Both clicks
    go through the shop's own page (the rows at the documented coordinates)."""
    task = BY_ID["web-shop-cheapest-mug"]
    assert task.solution is not None
    two = task.solution  # adds the red mug and waits for the cart page's banner
    # after the first add the cart page shows; go back and add the blue mug (row 0) too
    extra = ' && "$FORGE_PYTHON" -I "$FORGE_GUI" key alt+Left && sleep 1 && "$FORGE_PYTHON" -I "$FORGE_GUI" ' \
            'wait-colour 770 106 232,232,232 && "$FORGE_PYTHON" -I "$FORGE_GUI" click 860 125 && ' \
            '"$FORGE_PYTHON" -I "$FORGE_GUI" wait-colour 512 30 0,170,0'
    got = await _run(store, [task], scripts={task.id: two + extra})
    status, reward, output = got[task.id]
    assert status == "scored" and reward == 0.0, output
    assert '"cart": ["mug-red", "mug-blue"]' in output
