"""`forge analyze`: each behaviour metric on hand-made trajectories in all three APIs, the bootstrap, the
grouping and comparison, the CLI, and a run the suite makes itself (scripted engine -> proxy -> mini)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from openforge.store import Call, Store
from openforge.rollouts.analysis.analyze import analyze, bootstrap_change, bootstrap_mean
from openforge.rollouts.analysis.behaviour import behaviour_of, checkpoints_reached, is_check, is_edit
from openforge.rollouts.runner.transcript import ToolStep, tool_failed, transcript_of
from tests.helpers.analysis import _add, _chat_call, _tool_msg
from tests.helpers.mini import serve  # noqa: F401 - the scripted engine behind the real proxy, as a fixture


def chat_rollout_that_verifies() -> list[Call]:
    """mini-style: write a file with bash, read it back, answer."""
    user = {"role": "user", "content": "write hello to out.txt"}
    return [
        _chat_call(0, [user], [("bash", {"command": "echo hello > out.txt"})]),
        _chat_call(1, [user, _tool_msg("c0-0", "exit code 0\n")], [("read_file", {"path": "out.txt"})]),
        _chat_call(2, [user, _tool_msg("c0-0", "exit code 0\n"), _tool_msg("c1-0", "hello\n")], text="done"),
    ]


def anthropic_rollout_that_recovers() -> list[Call]:
    """Claude Code style: Write fails (is_error), Write again succeeds on the same path, answer."""
    tools = [{"name": n, "input_schema": {}} for n in ("Bash", "Read", "Write", "Edit")]

    def call(seq: int, blocks: list[dict[str, Any]], uses: list[tuple[str, dict[str, Any]]], text: str = "") -> Call:
        msgs = [{"role": "user", "content": "make a.txt"}, *([{"role": "user", "content": blocks}] if blocks else [])]
        calls = [{"id": f"toolu_{seq}", "name": n, "arguments": a} for n, a in uses]
        return Call(run_id="", rollout_id="", seq=seq, api="anthropic_messages", status="ok",
                    request_json={"messages": msgs, "tools": tools},
                    response_json={"type": "message", "content": [{"type": "text", "text": text}]},
                    tool_calls_json=calls, completion_tokens=5)

    failed = {"type": "tool_result", "tool_use_id": "toolu_0", "content": "permission denied", "is_error": True}
    ok = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "File created"}],
          "is_error": False}
    return [call(0, [], [("Write", {"file_path": "/w/a.txt", "content": "x"})]),
            call(1, [failed], [("Write", {"file_path": "/w/a.txt", "content": "x"})]),
            call(2, [failed, ok], [], text="created")]


def responses_rollout_that_does_not_recover() -> list[Call]:
    """Codex style: exec_command fails with a non-zero exit, then a different program runs fine."""
    tools = [{"type": "function", "name": n} for n in ("exec_command", "write_stdin", "view_image")]

    def call(seq: int, items: list[dict[str, Any]], cmd: str | None, text: str = "") -> Call:
        calls = [{"id": f"call_{seq}", "name": "exec_command", "arguments": {"cmd": cmd}}] if cmd else []
        return Call(run_id="", rollout_id="", seq=seq, api="openai_responses", status="ok",
                    request_json={"input": items, "tools": tools},
                    response_json={"output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}]},
                    tool_calls_json=calls, completion_tokens=7)

    out0 = {"type": "function_call_output", "call_id": "call_0",
            "output": "Chunk ID: 1\nProcess exited with code 2\nOutput:\nmake: *** No rule"}
    out1 = {"type": "function_call_output", "call_id": "call_1", "output": "Process exited with code 0\nOutput:\nok"}
    return [call(0, [], "make build"), call(1, [out0], "ls -la"), call(2, [out0, out1], None, text="gave it a go")]


class _Ro:
    def __init__(self, **kw: Any) -> None:
        self.id, self.task_id, self.harness, self.step = "ro-1", "t", "mini", 0
        self.reward, self.verifier_output, self.n_segments = 1.0, "", 1
        self.__dict__.update(kw)


def test_a_rollout_that_writes_then_reads_back_verified_itself() -> None:
    t = transcript_of(chat_rollout_that_verifies())
    assert t.turns == 3 and [s.name for s in t.steps] == ["bash", "read_file"] and t.final_text == "done"
    assert [s.failed for s in t.steps] == [False, False] and t.tools_offered == ["bash", "read_file", "write_file"]
    b = behaviour_of(_Ro(), t, {})
    assert (b.self_verified, b.tool_calls, b.error_recovery, b.gave_up) == (1.0, 2, None, None)
    assert b.tool_coverage == pytest.approx(2 / 3) and b.tokens_per_turn == pytest.approx(11.0)


def test_an_edit_after_the_last_check_is_not_verified() -> None:
    calls = chat_rollout_that_verifies()
    user = {"role": "user", "content": "x"}
    calls[2] = _chat_call(2, [user, _tool_msg("c1-0", "hello\n")], [("write_file", {"path": "out.txt", "content": "y"})])
    calls.append(_chat_call(3, [user, _tool_msg("c2-0", "wrote 1 characters")], text="done"))
    assert behaviour_of(_Ro(), transcript_of(calls), {}).self_verified == 0.0


def test_anthropic_is_error_then_same_subgoal_success_is_a_recovery() -> None:
    t = transcript_of(anthropic_rollout_that_recovers())
    assert [s.failed for s in t.steps] == [True, False]
    b = behaviour_of(_Ro(harness="claude-code"), t, {})
    assert b.error_recovery == 1.0 and b.self_verified == 0.0 and b.tool_coverage == pytest.approx(1 / 4)


def test_codex_failure_with_a_different_later_program_is_not_a_recovery() -> None:
    t = transcript_of(responses_rollout_that_does_not_recover())
    assert [s.failed for s in t.steps] == [True, False] and t.final_text == "gave it a go"
    assert behaviour_of(_Ro(harness="codex"), t, {}).error_recovery == 0.0


def test_give_up_only_counts_on_tasks_that_need_tools() -> None:
    answer_only = [_chat_call(0, [{"role": "user", "content": "fix f.py"}], text="it is fixed")]
    t = transcript_of(answer_only)
    assert behaviour_of(_Ro(), t, {"files": {"f.py": "x"}}).gave_up == 1.0
    assert behaviour_of(_Ro(), t, {"requires_tools": False, "files": {"f.py": "x"}}).gave_up is None
    assert behaviour_of(_Ro(), t, {}).gave_up is None
    assert behaviour_of(_Ro(), transcript_of(chat_rollout_that_verifies()), {"requires_tools": True}).gave_up == 0.0
    # a harness that never got an answer did not give up: it never ran
    assert behaviour_of(_Ro(), transcript_of([]), {"requires_tools": True}).gave_up is None


def test_plan_completion_reads_the_verifier_checkpoints() -> None:
    out = "checkpoint build: ok\ncheckpoint test: fail\ncheckpoint extra: ok\nscore: 0.5"
    assert checkpoints_reached(out) == {"build", "extra"}
    b = behaviour_of(_Ro(verifier_output=out), transcript_of([]), {"checkpoints": ["build", "test"]})
    assert b.plan_completion == 0.5
    assert behaviour_of(_Ro(verifier_output=out), transcript_of([]), {}).plan_completion is None


@pytest.mark.parametrize(("command", "edit", "check"), [
    ("echo hi > out.txt", True, False), ("cat out.txt", False, True), ("cd /w && pytest -q", False, True),
    ("ls 2>&1", False, True), ("grep x f >/dev/null", False, True), ("sed -i s/a/b/ f", True, False),
    ("python3 solve.py | tee log", True, False), ("curl x", False, False), ("FOO=1 python t.py", False, True),
])
def test_shell_commands_are_classified(command: str, edit: bool, check: bool) -> None:
    step = ToolStep(call_seq=0, id="x", name="bash", arguments={"command": command})
    assert (is_edit(step), is_check(step)) == (edit, check)


def test_failure_wording_of_each_harness() -> None:
    assert tool_failed("exit code 1\nboom") and not tool_failed("exit code 0\nerror handling works")
    assert tool_failed("Process exited with code 127") and tool_failed("error: unknown tool 'x'")
    assert tool_failed("Traceback (most recent call last):\n  File") and tool_failed("ok", is_error=True)
    assert not tool_failed("the word error appears in a sentence")


def test_bootstrap_mean_and_change() -> None:
    est = bootstrap_mean([0.0, 1.0, 1.0, 1.0])
    assert est.mean == 0.75 and 0.0 <= est.lo <= 0.75 <= est.hi <= 1.0 and est.n == 4
    assert bootstrap_mean([]).mean is None
    const = bootstrap_mean([2.0] * 5)
    assert (const.lo, const.hi) == (2.0, 2.0)
    ch = bootstrap_change([0.0] * 6, [1.0] * 6)
    assert (ch.mean, ch.lo, ch.hi) == (1.0, 1.0, 1.0)
    noisy = bootstrap_change([0, 1, 0, 1, 0, 1], [1, 0, 1, 0, 1, 0])
    assert noisy.lo < 0 < noisy.hi  # no real change: the interval straddles zero


@pytest.fixture
def training_run(store: Store) -> str:
    """Step 0: answers with no checking and fails; step 1: writes, reads back, passes. Plus an infra failure."""
    run = store.create_run(kind="train")
    store.add_tasks(run.id, [{"id": "t", "instruction": "x", "files": {"f": "1"}}])
    user = {"role": "user", "content": "x"}
    for _ in range(4):
        _add(store, run.id, "t", 0, [_chat_call(0, [user], [("bash", {"command": "echo 1 > f"})]),
                                     _chat_call(1, [user, _tool_msg("c0-0", "exit code 0")], text="ok")], reward=0.0)
        _add(store, run.id, "t", 1, chat_rollout_that_verifies(), reward=1.0)
    _add(store, run.id, "t", 1, [], reward=None, status="failed")  # not a sample of the policy
    return run.id


def test_by_step_shows_what_training_changed(store: Store, training_run: str) -> None:
    report = analyze(store, [training_run], by="step")
    assert [g.key for g in report.groups] == ["step 0", "step 1"]
    assert [g.n_rollouts for g in report.groups] == [4, 4]
    first, last = report.groups
    assert first.metrics["self_verified"].mean == 0.0 and last.metrics["self_verified"].mean == 1.0
    assert first.pass_at["1"] == 0.0 and last.pass_at["1"] == 1.0 and last.pass_hat["3"] == 1.0
    [change] = report.changes
    assert change.metrics["self_verified"].mean == 1.0 and change.metrics["self_verified"].lo == 1.0
    assert change.metrics["reward"].mean == 1.0


def test_prefix_break_reasons_are_counted(store: Store, training_run: str) -> None:
    calls = chat_rollout_that_verifies()
    calls[2].break_reason = "history rewritten"
    _add(store, training_run, "t", 1, calls, reward=1.0)
    last = analyze(store, [training_run], by="step").groups[-1]
    assert last.break_reasons == {"history rewritten": 1}


def test_by_harness_compares_the_same_tasks_under_two_harnesses(store: Store) -> None:
    run = store.create_run(kind="eval")
    store.add_tasks(run.id, [{"id": "t", "instruction": "x"}])
    for _ in range(3):
        _add(store, run.id, "t", 0, anthropic_rollout_that_recovers(), reward=1.0, harness="claude-code")
        _add(store, run.id, "t", 0, responses_rollout_that_does_not_recover(), reward=0.0, harness="codex")
    report = analyze(store, [run.id], by="harness")
    assert [g.key for g in report.groups] == ["claude-code", "codex"]
    assert report.changes[0].metrics["error_recovery"].mean == -1.0
    by_task = analyze(store, [run.id], by="task")
    assert [g.key for g in by_task.groups] == ["t"] and by_task.changes == []


def test_cli_prints_a_table_and_json(store: Store, training_run: str) -> None:
    from openforge.forge_cli.main import app

    runner = CliRunner()
    out = runner.invoke(app, ["analyze", training_run[:12], "--by", "step"])
    assert out.exit_code == 0, out.output
    assert "self_verified" in out.output and "step 0" in out.output and "pass@1" in out.output
    js = runner.invoke(app, ["analyze", training_run, "--json"])
    data = json.loads(js.output)
    assert data["by"] == "step" and len(data["rollouts"]) == 8 and data["changes"][0]["base"] == "step 0"
    bad = runner.invoke(app, ["analyze", training_run, "--by", "colour"])
    assert bad.exit_code == 1 and "--by must be harness, step or task" in bad.output
    missing = runner.invoke(app, ["analyze", "run-nope"])
    assert missing.exit_code == 1 and "no run" in missing.output


# -- on a run the suite makes itself: the scripted engine behind the real proxy (test_mini's `serve`), mini
# in a real sandbox --

WRITE = '<tool_call>\n{"name": "write_file", "arguments": {"path": "hello.txt", "content": "hello world\\n"}}\n</tool_call>'
READ = '<tool_call>\n{"name": "read_file", "arguments": {"path": "hello.txt"}}\n</tool_call>'


def test_analyze_a_real_mini_rollout(serve, store: Store) -> None:  # noqa: ANN001
    import asyncio

    from openforge.config import ForgeConfig
    from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
    from openforge.rollouts.tasks.format import load_tasks

    task = next(t for t in load_tasks("builtin") if t.id == "med-create-file")
    run = store.create_run(kind="eval")
    store.add_tasks(run.id, [task.to_record()])
    served, _ = serve([WRITE, READ, "Done: hello world"])
    [ro] = asyncio.run(RolloutRunner(store, config=ForgeConfig(), proxy_url=served.url, proxy_socket=served.uds)
                      .run(run.id, [RolloutSpec(task)]))
    assert ro.status == "scored", (ro.error, ro.stderr)
    [group] = analyze(store, [run.id], by="task").groups
    m = {k: v.mean for k, v in group.metrics.items()}
    assert (m["turns"], m["tool_calls"], m["self_verified"], m["prefix_breaks"]) == (3, 2, 1.0, 0)
    assert m["tool_coverage"] == pytest.approx(2 / 3) and m["reward"] == ro.reward


def test_behaviour_over_steps_feeds_the_dashboard(store: Store, training_run: str) -> None:
    from openforge.rollouts.analysis.analyze import behaviour_over_steps

    rows = behaviour_over_steps(store, training_run)
    assert [(step, n) for step, n, _ in rows] == [(0, 4), (1, 4)]
    assert rows[0][2]["self_verified"] == 0.0 and rows[1][2]["self_verified"] == 1.0
    assert rows[1][2]["tool_calls"] == 2.0 and rows[1][2]["error_recovery"] is None


async def test_the_dashboard_shows_behaviour_by_step(store: Store, training_run: str) -> None:
    from openforge.forge_cli.dashboard import Dashboard
    from tests.helpers.cli import plain

    app = Dashboard(store, training_run)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        shown = plain(app.query_one("#behaviour").content)
    lines = [ln.split() for ln in shown.splitlines() if ln.strip()]
    assert lines[0][:3] == ["step", "n", "verified"], shown
    assert lines[1][:4] == ["0", "4", "0%", "1.0"] and lines[2][:4] == ["1", "4", "100%", "2.0"], shown  # steps from 0


def test_html_report_holds_the_table_and_a_curve_per_metric(store: Store, training_run: str, tmp_path) -> None:  # noqa: ANN001
    import xml.etree.ElementTree as ET

    from openforge.forge_cli.main import app
    from openforge.rollouts.analysis.html import step_curves

    curves = {c.metric: c.points for c in step_curves(analyze(store, [training_run]).rollouts)}
    assert [(s, e.mean, e.n) for s, e in curves["self_verified"]] == [(0, 0.0, 4), (1, 1.0, 4)]
    assert [(s, e.mean) for s, e in curves["tool_calls"]] == [(0, 1.0), (1, 2.0)]
    assert curves["error_recovery"] == []  # no failed step anywhere: nothing to draw

    out = tmp_path / "report.html"
    res = CliRunner().invoke(app, ["analyze", training_run, "--html", str(out)])
    assert res.exit_code == 0 and f"wrote {out}" in res.output and "self_verified" in res.output, res.output
    page = out.read_text()
    assert page.startswith("<!doctype html>") and "<script" not in page
    assert "<th>step 0<br><small>n=4</small></th>" in page
    assert '<td>self_verified</td><td>0.0% <span class="ci">[0.0%, 0.0%]</span></td><td>100.0% <span' in page
    svgs = [ET.fromstring("<svg " + chunk[:chunk.index("</svg>") + 6]) for chunk in page.split("<svg ")[1:]]
    titles = [svg.find("text").text for svg in svgs]  # well-formed SVG, titled by metric
    # a curve for each metric defined at both steps; none for error_recovery/plan_completion/gave_up...
    assert titles == ["turns", "tool_calls", "tool_coverage", "self_verified", "gave_up", "prefix_breaks",
                      "tokens_per_turn", "reward"]
    bad = CliRunner().invoke(app, ["analyze", training_run, "--html", str(tmp_path / "no" / "dir" / "r.html")])
    assert bad.exit_code == 1 and "cannot write" in bad.output and "Traceback" not in bad.output
