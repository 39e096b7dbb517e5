"""A judge that sees a GUI rollout's screenshots, and the named judges of the field (WebVoyager,
WebJudge): their prompts, their strict verdict formats, and one GUI rollout through the real runner,
proxy and sandbox graded by a scripted judge on 127.0.0.1 that checks the screenshots it was sent."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from openforge.config import HarnessConfig, JudgeConfig
from openforge.forge_cli.main import app
from openforge.rollouts.tasks.judge import (IMAGE_REFERENCE, JudgeFailed, JudgeSpec, build_messages, parse_reply,
                                            recorded)
from openforge.rollouts.tasks.judge_prompts import NAMED_JUDGES
from openforge.store import Store
from tests.helpers.screen_judge import _ScreenJudge, judge_url  # noqa: F401 - fixtures
from tests.helpers.gui_fixtures import needs_display, run_gui_task


def _png(colour: tuple[int, int, int]) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8), colour).save(out, format="PNG")
    return out.getvalue()


@pytest.mark.parametrize(("name", "reply", "score"), [
    ("webvoyager", "The screenshot shows the recipe.\n\nSUCCESS", 1.0),
    ("webvoyager", "It did not finish.\nNOT SUCCESS\n", 0.0),
    ("webvoyager", "Verdict: NOT SUCCESS", 0.0),
    ("webjudge", 'Thoughts: all key points met.\nStatus: "success"', 1.0),
    ("webjudge", "Thoughts: the filter was wrong.\nStatus: failure", 0.0),
])
def test_a_named_judges_verdict_parses(name: str, reply: str, score: float) -> None:
    assert parse_reply(reply, "verdict", NAMED_JUDGES[name]) == score


@pytest.mark.parametrize(("name", "reply"), [
    ("webvoyager", "The task was completed."),  # no verdict
    ("webvoyager", "SUCCESS\nThe agent found it."),  # the verdict is not the last line
    ("webvoyager", "NOT SUCCESS\nSUCCESS"),  # two verdicts
    ("webvoyager", "**SUCCESS**"), ("webvoyager", "success"), ("webvoyager", "SUCCESS."),
    ("webvoyager", "VERDICT: PASS"),  # the rubric judge's format is not WebVoyager's
    ("webjudge", "Thoughts: fine"), ('webjudge', 'Status: "success"\nThoughts: fine'),
    ("webjudge", 'Status: "failure"\nStatus: "success"'), ("webjudge", "Status: done"),
    ("webjudge", 'status: "success"'), ("webjudge", "SUCCESS"),
])
def test_anything_else_from_a_named_judge_is_unparseable(name: str, reply: str) -> None:
    with pytest.raises(JudgeFailed, match=f"unparseable {name} judge reply"):
        parse_reply(reply, "verdict", NAMED_JUDGES[name])


def test_screenshots_go_as_image_parts_inside_the_quoted_block_and_are_recorded_as_references() -> None:
    red, blue = _png((255, 0, 0)), _png((0, 0, 255))
    spec = JudgeSpec(name="webvoyager", screenshots=2)
    messages = build_messages(spec, instruction="Find the red page.", answer="Done. SUCCESS", files={},
                              max_chars=1000, images=[red, blue], token="t0k")
    system, parts = messages[0]["content"], messages[1]["content"]
    assert "SUCCESS or NOT SUCCESS" in system and "<<<BEGIN DATA t0k: ...>>>" in system
    kinds = [p["type"] for p in parts]
    assert kinds == ["text", "text", "image_url", "image_url", "text", "text"]
    assert parts[1]["text"] == "<<<BEGIN DATA t0k: screenshots>>>" and parts[4]["text"] == "<<<END DATA t0k>>>"
    assert "# TASK\nFind the red page." in parts[0]["text"]
    assert "<<<BEGIN DATA t0k: final answer>>>\nDone. SUCCESS\n<<<END DATA t0k>>>" in parts[0]["text"]
    assert base64.b64decode(parts[2]["image_url"]["url"].split(",", 1)[1]) == red
    kept = recorded(messages)
    assert [p["image_url"]["url"] for p in kept[1]["content"] if p["type"] == "image_url"] == [
        IMAGE_REFERENCE + hashlib.sha256(img).hexdigest() for img in (red, blue)]
    assert messages[1]["content"][2]["image_url"]["url"].startswith("data:image/png;base64,")  # not mutated
    # a rubric judge that sees screenshots says so when there are none; one that does not sees text only
    none = build_messages(JudgeSpec(rubric="r", sees=["answer", "screenshots"]), instruction="q", answer="a",
                          files={}, max_chars=100)
    assert "(none: the agent sent no screenshot)" in none[1]["content"][0]["text"]
    assert isinstance(build_messages(JudgeSpec(rubric="r"), instruction="q", answer="a", files={},
                                     max_chars=100)[1]["content"], str)


def test_the_action_history_is_each_tool_call_or_text_action_in_order() -> None:
    from openforge.rollouts.runner.transcript import action_history
    from openforge.store import Call

    def chat(text: str | None) -> dict:
        return {"choices": [{"message": {"role": "assistant", "content": text}}]}

    calls = [
        Call(run_id="r", rollout_id="ro", seq=2, status="ok", response_json=chat("done(\n  42 )")),
        Call(run_id="r", rollout_id="ro", seq=0, status="ok", response_json=chat(None),
             tool_calls_json=[{"id": "a", "name": "click", "arguments": {"x": 3, "y": 4}}]),
        Call(run_id="r", rollout_id="ro", seq=1, status="error", response_json=None),  # not answered: no action
    ]
    assert action_history(calls) == ['click({"x": 3, "y": 4})', "done( 42 )"]
    spec = JudgeSpec(rubric="r", sees=["answer", "actions"])
    user = build_messages(spec, instruction="q", answer="a", files={}, max_chars=100, actions=action_history(calls),
                          token="t0k")[1]["content"]
    assert "<<<BEGIN DATA t0k: action history>>>\n1. click({\"x\": 3, \"y\": 4})\n2. done( 42 )\n<<<END DATA t0k>>>" in user
    assert "(no actions)" in build_messages(spec, instruction="q", answer="a", files={}, max_chars=100)[1]["content"]


def test_the_dashboard_and_forge_show_list_a_runs_judgements(store: Store) -> None:
    from openforge.forge_cli.dashboard import metrics_table
    from openforge.readmodel import read_snapshot
    from openforge.store import Judgement

    run = store.create_run(kind="eval")
    assert "judgements" not in _render(metrics_table(read_snapshot(store, run.id)))  # none: no row
    messages = recorded(build_messages(JudgeSpec(name="webvoyager"), instruction="Find it.", answer="Found.",
                                       files={}, max_chars=100, images=[_png((255, 0, 0))]))
    store.add_judgement(Judgement(run_id=run.id, rollout_id="ro-one", model="wv", prompt_json=messages,
                                  reply="Shown.\nSUCCESS", score=1.0, latency_ms=12.0))
    store.add_judgement(Judgement(run_id=run.id, rollout_id="ro-two", model="wv", prompt_json=messages,
                                  error="the judge did not answer within 60s"))
    # the label and its value, however wide the table's other rows make the column between them
    assert re.search(r"^judgements +2 \(1 failed\)", _render(metrics_table(read_snapshot(store, run.id))), re.M)
    out = CliRunner().invoke(app, ["show", run.id, "--judgements"], catch_exceptions=False).output
    assert "ro-one" in out and "SUCCESS" in out and "did not answer" in out and "1 screenshots" in out, out
    out = CliRunner().invoke(app, ["show", run.id, "--rollout", "ro-one"], catch_exceptions=False).output
    assert "ro-two" not in out and "# TASK\nFind it." in out and f"[image {IMAGE_REFERENCE}" in out, out
    assert "judge reply" in out and out.rstrip().endswith("SUCCESS")


def _render(table: object) -> str:
    from rich.console import Console

    console = Console(record=True, width=120)
    console.print(table)
    return console.export_text()


def test_a_named_judge_needs_no_rubric_and_the_rubric_judge_does() -> None:
    assert JudgeSpec(name="webjudge").rubric == ""
    with pytest.raises(ValueError, match="rubric judge grades by it"):
        JudgeSpec(rubric=" ")
    with pytest.raises(ValueError):
        JudgeSpec(name="gpt-judge")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gives its own verdict"):
        JudgeSpec(name="webvoyager", output="score")


@needs_display
@pytest.mark.parametrize("name", ["webvoyager", "webjudge"])
def test_a_gui_rollouts_last_screenshots_reach_the_judge(name: str, tiny_vl_model: Path, store: Store,
                                                         judge_url: str) -> None:
    """gui-colour-click-red by mini-gui (three turns: two clicks, then done, one screenshot each) graded
    by its site's state and by a named judge shown the last two screenshots: the judge receives exactly
    the images the policy's last two calls recorded, in order (and says SUCCESS only then); the
    judgement row keeps references; `forge show --judgements` lists it."""
    _ScreenJudge.seen.clear()
    ro, _ = run_gui_task(store, tiny_vl_model, ["click(1)", "click(0)", "done()"], "gui-colour-click-red",
                         HarnessConfig(name="mini-gui", max_turns=4, max_tokens=8,
                                       extra_args=["--grid", "2x2", "--no-tools", "--max-side", "512"]),
                         judge=JudgeConfig(url=judge_url, model=f"{name}-2"),
                         task_judge=JudgeSpec(name=name, screenshots=2))
    # the site kept the first click (green): the exact grader says 0, the judge (shown two screens) 1
    assert (ro.status, ro.reward) == ("scored", 0.5), (ro.error, ro.verifier_output, ro.stdout)
    assert "site state: wrong" in ro.verifier_output and "judge: verdict score 1, weight 1" in ro.verifier_output
    calls = store.list_calls(rollout_id=ro.id)
    shots = [c.images[-1] for c in calls]  # the screen after the first click stays: the last two are alike
    assert len(calls) == 3 and shots[0] != shots[1] == shots[2]
    [seen] = _ScreenJudge.seen
    assert seen["shas"] == shots[:2]  # the last two distinct screens, oldest first
    [row] = store.list_judgements(rollout_id=ro.id)
    refs = [p["image_url"]["url"] for p in row.prompt_json[1]["content"] if p["type"] == "image_url"]
    assert refs == [IMAGE_REFERENCE + sha for sha in shots[:2]] and row.score == 1.0
    text = seen["body"]["messages"][1]["content"][0]["text"]  # WebJudge reads the action history, WebVoyager not
    assert ("# The agent's action history (data)" in text) == (name == "webjudge")
    if name == "webjudge":
        assert "action history>>>\n1. click(1)\n2. click(0)\n3. done()\n<<<END DATA" in text, text
    out = CliRunner().invoke(app, ["show", ro.run_id, "--judgements"], catch_exceptions=False).output
    assert f"{ro.id[:12]}" in out and "2 screenshots" in out and name in out, out
