"""Red team of GUI tasks' rewards (docs/security.md, "Red team, GUI tasks"): the policy as an adversary
that controls every action mini-gui accepts, trying to turn its zero into a harness failure (which drops
its group) or to get the task's state or answer without doing the task. Each test here failed before
its fix but one (marked); the attacks that already failed are listed in the docs' table."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from openforge.rollouts.harnesses.mini_gui_agent import Action, BadAction, Screen, execute, parse_reply
from openforge.rollouts.tasks.web import server as site_server
from openforge.rollouts.tasks.web.server import SiteSession
from openforge.rollouts.tasks.web.spec import GuiTask
from openforge.sandbox import gui
from tests.helpers.gui_fixtures import ScriptedModel, missing_gui_tools, run_mini_gui, text_reply, wait_for
from tests.helpers.required import requires, skip_or_fail

needs_display = requires("chromium", f"needs {', '.join(missing_gui_tools())} (apt-get install xvfb xdotool chromium)"
                         if missing_gui_tools() else None)

# Replies that crashed mini-gui (an agent error or a dead display: a harness failure, the group dropped)
# before they became invalid actions, each with what it did then.
HOSTILE_REPLIES = [
    "key(Terminate_Server)",                           # xdotool binds the keysym; Xvfb's XKB action ends it
    '{"action": "key", "combo": "0xfed5"}',            # the same keysym as a number
    "key(ctrl+alt+XF86_Switch_VT_2)",                  # a server action (a no-op in Xvfb; refused all the same)
    '{"action": "key", "combo": "Return\\n"}',          # `$` matched before the newline; xdotool exits 1
    "key(a+a+a+a+a+a+a+a+a+a+a+a+a+a+a+a)",            # xdotool overruns its key list: heap corruption, abort
    '{"action": "click", "x": NaN, "y": 1}',           # int(nan): ValueError past the BadAction handler
    "click(1e999, 0)",                                 # int(inf): OverflowError
    '{"action": "scroll", "dy": -Infinity}',
    '{"action": "type", "text": "a\\u0000b"}',          # a NUL in xdotool's argv: ValueError
    '{"action": "type", "text": "\\ud800"}',           # a lone surrogate: UnicodeEncodeError
    '{"action": "done", "answer": "\\ud800"}',         # the answer file could not be written: exit 1
]


@pytest.mark.parametrize("reply", HOSTILE_REPLIES)
def test_hostile_replies_are_invalid_actions_not_agent_crashes(reply: str) -> None:
    with pytest.raises(BadAction):
        parse_reply(text_reply(reply), None)


def test_ordinary_keys_and_text_still_pass() -> None:
    for combo in ("Return", "ctrl+a", "ctrl+shift+Tab", "F5", "alt+Left", "a+b+c+d+e+f+g+h"):
        assert parse_reply(text_reply(f"key({combo})"), None) == Action("key", (combo,))
    assert parse_reply(text_reply('type("héllo wörld 😀\\n")'), None) == Action("type", ("héllo wörld 😀\n",))
    assert parse_reply(text_reply("click(3.0, 4)"), None) == Action("click", (3, 4))


@pytest.fixture(scope="module")
def display() -> Any:
    """A display as sandboxes start it (sandbox/gui.py: its server keys disarmed)."""
    if missing_gui_tools():
        skip_or_fail("chromium", f"needs {', '.join(missing_gui_tools())}")
    proc, number = gui.start_xvfb(640, 480)
    try:
        yield number
    finally:
        gui._end(proc)


@needs_display
def test_every_hostile_reply_costs_a_step_and_the_run_ends_done(display: str, tmp_path: Path) -> None:
    """The whole agent in a real display: every hostile reply is reported back as invalid, then `done`
    is the answer. Folders left where the agent writes its result and answer (what a browser's save
    dialog can make) are moved aside: they made the final write raise, exit 1, no result."""
    (tmp_path / ".forge" / "mini_gui_result.json").mkdir(parents=True)
    (tmp_path / ".forge" / "answer.txt").mkdir()
    script = iter([*HOSTILE_REPLIES, "done(ok)"])
    model = ScriptedModel(lambda body: text_reply(next(script)))
    try:
        proc, record = run_mini_gui(tmp_path, display, model.base_url, "Do nothing useful.", "--no-tools",
                                    "--max-steps", str(len(HOSTILE_REPLIES) + 1), "--settle", "0.2")
    finally:
        model.close()
    assert proc.returncode == 0, proc.stderr
    assert record == {"status": "done", "answer": "ok", "steps": len(HOSTILE_REPLIES) + 1, "error": None}
    assert (tmp_path / ".forge" / "answer.txt").read_text() == "ok"
    history = model.requests[-1]["messages"][1]["content"][0]["text"]
    assert history.count(". invalid: ") == 5  # the history shows the last five
    gui.screenshot(display)  # the display is alive


@needs_display
def test_xdotool_refusing_the_policys_keys_is_the_policys_mistake(display: str) -> None:
    """A key sequence xdotool itself fails on (here one past the parser's limit, sent directly) is an
    invalid action while the display answers: not a harness failure."""
    screen = Screen(display, 640, None)
    screen.screenshot_png()
    with pytest.raises(BadAction, match="xdotool key"):
        execute(Action("key", ("+".join(["a"] * 16),)), screen)
    gui.screenshot(display)


@needs_display
def test_the_sandbox_display_survives_its_server_keys(tmp_path: Path) -> None:
    """Any program in a GUI sandbox (a tool-using harness, a reference solution) pressing the X server's
    own keys: Terminate_Server ended Xvfb, and every later screenshot failed."""
    shot = tmp_path / "after.png"
    keys = "xdotool key Terminate_Server; xdotool key 0xfed5; xdotool key ctrl+alt+XF86_Switch_VT_2"
    import sys
    done = subprocess.run([sys.executable, "-I", gui.__file__, "run", "--size", "320x240", "--",
                           "sh", "-c", f'{keys}; "$0" -I "$1" screenshot "$2"', sys.executable, gui.__file__, str(shot)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert shot.stat().st_size > 0


# -- the site's server (rollouts/tasks/web/server.py) ------------------------------------------------------

def _connect(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)  # blocking: waits while the listen backlog is full
    s.settimeout(30)
    return s


def _ask(s: socket.socket, request: bytes) -> bytes:
    """The reply's head; b"" when the server closed the connection unanswered (a close with our request
    unread reaches us as a reset, or as a broken pipe if it came before we sent)."""
    data = b""
    try:
        s.sendall(request)
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except (ConnectionResetError, BrokenPipeError):
        pass
    return data


def _site_threads() -> int:
    return sum("process_request_thread" in t.name for t in threading.enumerate())


def test_a_flood_of_connections_gets_no_thread_each_and_bad_requests_get_400(capfd: pytest.CaptureFixture[str]) -> None:
    """Each connection was a thread of the runner for as long as the sandbox held it; 200 idle ones were
    200 threads. Now at most MAX_CONNECTIONS are served, the rest closed unanswered, and the site
    serves again once they go. A bad Content-Length was a traceback on the runner's stderr."""
    site = SiteSession(GuiTask(site="colour", params={}, expect_state={"clicks": ["red"]}))
    flood: list[socket.socket] = []
    try:
        before = _site_threads()
        flood = [_connect(site.socket_path) for _ in range(200)]
        assert _ask(flood[-1], b"GET / HTTP/1.1\r\nHost: x\r\n\r\n") == b""  # over the limit: closed
        assert _site_threads() - before <= site_server.MAX_CONNECTIONS
        for s in flood:
            s.close()
        get = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
        wait_for(lambda: _ask(_connect(site.socket_path), get).startswith(b"HTTP/1.1 200"), 30, "the site serving again")
        for length in (b"abc", b"-1", b"999999"):
            reply = _ask(_connect(site.socket_path), b"POST /click HTTP/1.1\r\nHost: x\r\nContent-Length: " + length +
                         b"\r\n\r\ncolour=red")
            assert reply.split(b"\r\n", 1)[0] in (b"HTTP/1.1 400 Bad Request", b"HTTP/1.1 413 Request Entity Too Large")
        assert site.state() == {"clicks": []}
        assert "Traceback" not in capfd.readouterr().err
    finally:
        for s in flood:
            s.close()
        site.close()


def test_closing_the_site_never_waits_on_a_connection_held_open() -> None:
    """The runner closes the site after the sandbox (shielded, in a thread): a connection still open
    there (a relay that never noticed its pod go) must not make close() wait on its thread. Already
    held (daemon threads are not joined); kept, it costs half a second."""
    site = SiteSession(GuiTask(site="colour", params={}, expect_state={"clicks": ["red"]}))
    held = _connect(site.socket_path)
    held.sendall(b"GET / HTTP/1.1\r\n")  # a request begun and never finished
    wait_for(lambda: _site_threads() > 0, 10, "the connection being served")
    closer = threading.Thread(target=site.close, daemon=True)
    closer.start()
    closer.join(timeout=10)
    held.close()
    assert not closer.is_alive(), "SiteSession.close() waited on a connection held open"
    assert not os.path.exists(site.socket_path)


def test_a_lone_surrogate_in_browser_uses_answer_is_a_wrong_answer_not_an_infra_failure() -> None:
    """JSON spells lone surrogates; the runner writes the answer file as UTF-8, which raised on one."""
    from openforge.rollouts.harnesses.browseruse import browser_use_outcome
    from openforge.sandbox.base import ExecResult
    record = json.dumps({"is_done": True, "final_result": "1931\ud800", "steps": 1, "answered": 1})
    outcome = browser_use_outcome(ExecResult(exit_code=0, stdout="", stderr="", timed_out=False, duration_s=1.0), record)
    assert outcome.failure is None and outcome.answer is not None and outcome.answer != "1931"
    outcome.answer.encode("utf-8")
