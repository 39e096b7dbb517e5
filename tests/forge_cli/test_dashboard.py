"""Pilot tests of the dashboard against a store with known content."""

from __future__ import annotations

from datetime import timedelta

import pytest
from textual.widgets import DataTable, RichLog, Static

import openforge.forge_cli.dashboard as dashboard
from openforge.forge_cli.dashboard import CallScreen, HelpScreen, make_dashboard
from openforge.forge_cli.snapshot import conversation
from openforge.readmodel import read_snapshot, run_log_path
from openforge.store import Call, Store, TrainStep, utcnow
from tests.helpers.cli import plain, wait_for

CONFIG = {
    "engine": {"kind": "embedded", "model": "/data/models/tiny"},
    "harness": {"name": "mini"},
    "sandbox": {"type": "local"},
    "trainer": {"steps": 3},
}


class FakeController:
    """Records what the dashboard asks; the real one is runs.control.RunController."""

    def __init__(self) -> None:
        self.paused = False
        self.calls: list[str] = []

    def pause(self) -> None:
        self.paused = True
        self.calls.append("pause")

    def resume(self) -> None:
        self.paused = False
        self.calls.append("resume")

    def stop(self) -> None:
        self.calls.append("stop")


@pytest.fixture
def known_run(store: Store) -> str:
    run = store.create_run(name="known", config=CONFIG, owner_pid=None)
    store.set_run_status(run.id, "running")
    store.update_run(run.id, started_at=utcnow() - timedelta(seconds=75), current_adapter="step-2")
    store.add_tasks(run.id, [{"id": "add", "instruction": "add numbers"}])
    done = []
    for i, reward in enumerate((1.0, 0.0, 1.0)):
        r = store.create_rollout(run_id=run.id, task_id="add", step=0, sample_index=i, harness="mini")
        store.update_rollout(r.id, status="running")
        done.append(store.update_rollout(r.id, status="scored", reward=reward, n_calls=2, n_tokens=40))
    live = store.create_rollout(run_id=run.id, task_id="add", step=1, harness="mini")
    store.update_rollout(live.id, status="running", n_calls=1)
    store.add_train_step(TrainStep(run_id=run.id, step=0, loss=0.1234, reward_mean=0.25, pass_rate=0.25,
                                   kl=0.001, mismatch_mean=0.0021, mismatch_max=0.05, tokens_per_s=321.5))
    store.add_train_step(TrainStep(run_id=run.id, step=1, loss=0.0987, reward_mean=0.5, pass_rate=0.5,
                                   kl=0.002, mismatch_mean=0.0031, mismatch_max=0.07, tokens_per_s=345.25))
    request = {"model": "forge-policy", "messages": [
        {"role": "system", "content": "You solve tasks."},
        {"role": "user", "content": "Add 2 and [b]3[/b]."},
    ], "tools": [{"type": "function", "function": {"name": "bash", "parameters": {}}}]}
    response = {"choices": [{"message": {"role": "assistant", "content": "Let me run it.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{\"cmd\": \"echo 5\"}"}}]}}]}
    store.add_call(Call(run_id=run.id, rollout_id=done[0].id, seq=0, api="openai_chat", model="forge-policy",
                        status="ok", request_json=request, response_json=response,
                        prompt_ids=list(range(17)), completion_ids=[1, 2, 3],
                        tool_calls_json=[{"name": "bash", "arguments": {"cmd": "echo 5"}}],
                        prompt_tokens=17, completion_tokens=3, latency_ms=42.0, finish_reason="tool_calls"))
    store.add_call(Call(run_id=run.id, rollout_id=live.id, seq=0, api="anthropic_messages", model="forge-policy",
                        status="in_flight", request_json={"system": "sys", "messages": [
                            {"role": "user", "content": [{"type": "text", "text": "hello claude"}]}]}))
    log = run_log_path(store.path, run.id)
    log.parent.mkdir(parents=True)
    log.write_text("13:00:01 engine up at http://127.0.0.1:1234\n13:00:02 step 1 reward 0.25\n")
    return run.id


def cells(table: DataTable) -> list[list[str]]:
    return [[plain(c).strip() for c in table.get_row(row.key)] for row in table.ordered_rows]


async def test_shows_the_runs_state(store: Store, known_run: str) -> None:
    app = make_dashboard(store.path, known_run)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        header = plain(app.query_one("#header", Static).content)
        for part in (known_run, "running", "model tiny", "harness mini", "engine embedded", "sandbox local",
                     "steps 2/3", "adapter step-2", "elapsed 1:1"):
            assert part in header, (part, header)
        metrics = plain(app.query_one("#metrics", Static).content)
        assert "0.0987" in metrics and "0.500" in metrics and "345.2" in metrics and "0.0031" in metrics
        assert "running 1" in metrics and "scored 3" in metrics
        rows = cells(app.query_one("#rollouts", DataTable))
        assert len(rows) == 4
        assert rows[0][3] == "running" and rows[0][2] == "1"  # in-flight first; steps numbered from 0, as stored
        assert sorted(r[7] for r in rows[1:]) == ["0.00", "1.00", "1.00"]
        calls = cells(app.query_one("#calls", DataTable))
        assert [c[2] for c in calls] == ["messages", "chat"]  # newest first
        assert calls[1][4:8] == ["17", "3", "42", "tool_calls"]
        log = app.query_one("#log", RichLog)
        assert any("step 1 reward 0.25" in line.text for line in log.lines)


async def test_follows_the_store_on_a_timer(store: Store, known_run: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dashboard, "POLL_S", 0.05)
    app = make_dashboard(store.path, known_run)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        live = store.list_rollouts(known_run, status="running")[0]
        store.update_rollout(live.id, status="scored", reward=0.75)
        store.add_train_step(TrainStep(run_id=known_run, step=2, loss=0.05, reward_mean=0.9, pass_rate=0.8))
        with run_log_path(store.path, known_run).open("a") as fh:
            fh.write("13:00:09 step 3 reward 0.9\n13:00:09 half a li")
        store.set_run_status(known_run, "finished")
        await wait_for(pilot, lambda: "finished" in plain(app.query_one("#header", Static).content))
        header = plain(app.query_one("#header", Static).content)
        assert "finished" in header and "steps 3/3" in header
        assert "0.75" in [r[7] for r in cells(app.query_one("#rollouts", DataTable))]
        lines = [line.text for line in app.query_one("#log", RichLog).lines]
        assert "13:00:09 step 3 reward 0.9" in lines
        assert not any("half a li" in line for line in lines)  # an unfinished line waits


async def test_enter_on_a_call_opens_its_conversation(store: Store, known_run: str) -> None:
    app = make_dashboard(store.path, known_run)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        app.query_one("#calls", DataTable).focus()
        await pilot.press("down", "enter")  # the second row: the chat call
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, CallScreen)
        text = "\n".join(plain(s.content) for s in screen.query(Static))
        assert "Add 2 and [b]3[/b]." in text  # shown literally, not as markup
        assert "You solve tasks." in text and "prompt 17" in text and "completion 3" in text
        assert "-> bash({\"cmd\": \"echo 5\"})" in text
        assert "tool calls (1)" in [s.border_title for s in screen.query(".turn")]
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, CallScreen)


async def test_p_pauses_and_resumes_through_the_controller(store: Store, known_run: str) -> None:
    ctl = FakeController()
    app = make_dashboard(store.path, known_run, controller=ctl)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("p")
        assert ctl.calls == ["pause"]
        assert "paused" in plain(app.query_one("#header", Static).content)
        await pilot.press("p")
        assert ctl.calls == ["pause", "resume"]
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        assert "pause / resume" in plain(app.screen.query_one("#help-text", Static).content)
        await pilot.press("escape")
        await pilot.press("q")
    assert ctl.calls == ["pause", "resume", "stop"]
    assert app.return_code == 0


async def test_ctrl_c_stops_the_run_too(store: Store, known_run: str) -> None:
    ctl = FakeController()
    app = make_dashboard(store.path, known_run, controller=ctl)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("ctrl+c")
    assert ctl.calls == ["stop"]


async def test_read_only_view_refuses_pause_and_quits(store: Store, known_run: str) -> None:
    app = make_dashboard(store.path, "latest")
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await pilot.press("p")
        await pilot.pause()
        assert any("read-only" in n.message for n in app._notifications)
        assert app.sub_title == "read-only"
        await pilot.press("q")
    assert app.return_code == 0


async def test_a_finished_run_can_close_by_itself(store: Store, known_run: str) -> None:
    store.set_run_status(known_run, "finished")
    app = make_dashboard(store.path, known_run, exit_after_done_s=0.1)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app._exit)  # asked to exit without a key press


async def test_a_store_error_is_shown_and_the_view_carries_on(store: Store, known_run: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from openforge.errors import StoreError

    real = dashboard.read_snapshot
    app = make_dashboard(store.path, known_run)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await pilot.pause()
        monkeypatch.setattr(dashboard, "read_snapshot", lambda *a, **k: (_ for _ in ()).throw(
            StoreError("the run store x is locked by another process; retry, or stop that process")))
        app.refresh_state()
        app.refresh_state()  # the same error is said once
        await pilot.pause()
        assert [n.message for n in app._notifications if "locked" in n.message] == [
            "cannot read the run store: the run store x is locked by another process; retry, or stop that process"]
        monkeypatch.setattr(dashboard, "read_snapshot", real)
        store.set_run_status(known_run, "finished")
        app.refresh_state()
        assert "finished" in plain(app.query_one("#header", Static).content)


def test_conversation_of_each_api() -> None:
    anth = Call(api="anthropic_messages", status="ok", request_json={
        "system": [{"type": "text", "text": "be brief"}],
        "messages": [{"role": "user", "content": "list files"},
                     {"role": "assistant", "content": [{"type": "tool_use", "name": "ls", "input": {"p": "."}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "a.txt"}]}]},
        response_json={"content": [{"type": "text", "text": "a.txt is there"}]})
    assert conversation(anth) == [("system", "be brief"), ("user", "list files"),
                                  ("assistant", "-> ls({\"p\": \".\"})"), ("user", "<- a.txt"),
                                  ("assistant (sampled)", "a.txt is there")]
    resp = Call(api="openai_responses", status="ok", request_json={
        "instructions": "sys", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                                         {"type": "function_call", "name": "sh", "arguments": "{}"},
                                         {"type": "function_call_output", "call_id": "x", "output": "ok"}]},
        response_json={"output": [{"type": "message", "role": "assistant",
                                              "content": [{"type": "output_text", "text": "done"}]}]})
    assert conversation(resp) == [("system", "sys"), ("user", "hi"), ("assistant", "-> sh({})"), ("tool", "<- ok"),
                                  ("assistant (sampled)", "done")]
    broken = Call(api="openai_chat", status="error", request_json="{not json")
    assert conversation(broken)[0] == ("raw", "{not json")


def test_snapshot_puts_in_flight_rollouts_first(store: Store, known_run: str) -> None:
    snap = read_snapshot(store, known_run, max_rollouts=2)
    assert [r.status for r in snap.rollouts] == ["running", "scored"]
    assert snap.counts == {"scored": 3, "running": 1} and snap.n_calls == 2


def test_unknown_run_is_one_clear_error(store: Store) -> None:
    from openforge.errors import NotFoundError

    with pytest.raises(NotFoundError, match="no run 'nope'"):
        make_dashboard(store.path, "nope")


async def test_the_log_pane_shows_the_newest_lines(store: Store, known_run: str) -> None:
    with run_log_path(store.path, known_run).open("a") as fh:
        fh.writelines(f"13:01:{i:02d} I forge.up: line {i} of a long log that wraps in a narrow pane\n" for i in range(60))
    app = make_dashboard(store.path, known_run)
    async with app.run_test(size=(150, 44)) as pilot:
        log = app.query_one("#log", RichLog)
        await wait_for(pilot, lambda: log.max_scroll_y > 0 and log.scroll_y == log.max_scroll_y)


async def test_a_failed_rollout_shows_why_when_selected(store: Store, known_run: str) -> None:
    failed = store.create_rollout(run_id=known_run, task_id="add", step=1, sample_index=1, harness="claude-code")
    reason = "harness: API error 400: prompt too long"
    store.update_rollout(failed.id, status="failed", failure_kind="harness", error=reason)
    app = make_dashboard(store.path, known_run)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        table = app.query_one("#rollouts", DataTable)
        table.focus()
        keys = [row.key.value for row in table.ordered_rows]
        detail = app.query_one("#rollout-detail", Static)
        await pilot.press(*["down"] * keys.index(failed.id))
        await wait_for(pilot, lambda: failed.id in plain(detail.content))
        text = plain(detail.content)
        assert "failed" in text and f"why (harness): {reason}" in text
        scored = next(k for k in keys if k != failed.id and store.get_rollout(k).status == "scored")
        await pilot.press(*["up"] * keys.index(failed.id))
        await pilot.press(*["down"] * keys.index(scored))
        await wait_for(pilot, lambda: scored in plain(detail.content))
        assert "why" not in plain(detail.content) and "reward" in plain(detail.content)


async def test_the_engine_trainer_mismatch_reaches_the_store_the_dashboard_and_forge_show(
        store: Store, known_run: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from openforge.trainer.loop import _record_step
    from tests.helpers.cli import invoke

    # a step's metrics as trainer/loop.py records them: the mismatch figures go in metrics_json
    _record_step(store, known_run, {"step": 2, "loss": 0.05, "mismatch_mean": 0.01, "mismatch_max": 2.0148,
                                    "mismatch_kl": 0.000321, "mismatch_ratio_max": 7.5, "masked_tokens": 2}, None)
    [row] = [s for s in store.list_train_steps(known_run) if s.step == 2]
    assert (row.metrics_json["mismatch_kl"], row.metrics_json["mismatch_ratio_max"]) == (0.000321, 7.5)
    app = make_dashboard(store.path, known_run)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        metrics = plain(app.query_one("#metrics", Static).content)
        assert "mismatch KL" in metrics and "0.000321" in metrics
        assert "max ratio" in metrics and "7.5 (2 masked)" in metrics
    monkeypatch.setenv("COLUMNS", "200")
    res = invoke("show", known_run)
    assert res.exit_code == 0
    [shown] = [line for line in res.stdout.splitlines() if line.startswith("│") and line.strip("│ ").startswith("2 ")]
    assert "0.000321" in shown and "7.5" in shown
