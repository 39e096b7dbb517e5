"""rollouts/tasks/web/server.py: one rollout's site on a unix socket in a private folder; the state changes only
through the site's HTTP actions, and `grade` reads it on the host. (The connection limits against a flooding
sandbox are tests/sandbox/test_gui_redteam.py's.)"""

from __future__ import annotations

import http.client
import os
import socket
import stat

from openforge.rollouts.tasks.web.server import MAX_BODY, SiteSession
from openforge.rollouts.tasks.web.spec import GuiTask
from openforge.sandbox.gui import SITE_URL


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("site", timeout=10)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def _post(site: SiteSession, path: str, body: str, length: int | None = None) -> tuple[int, dict[str, str]]:
    conn = _UnixConnection(site.socket_path)
    headers = {"Content-Type": "application/x-www-form-urlencoded", "Content-Length": str(
        len(body) if length is None else length)}
    conn.request("POST", path, body=body.encode(), headers=headers)
    reply = conn.getresponse()
    reply.read()
    conn.close()
    return reply.status, dict(reply.getheaders())


def test_a_click_through_the_socket_is_the_state_the_grader_reads() -> None:
    site = SiteSession(GuiTask(site="colour", path="/", expect_state={"clicks": ["red"]}))
    try:
        assert stat.S_IMODE(os.stat(site.folder).st_mode) == 0o700  # the socket's folder is ours alone
        assert site.gui_spec().url == SITE_URL.rstrip("/") + "/" and site.gui_spec().site_socket == site.socket_path
        ok, line = site.grade()
        assert not ok and "wrong" in line
        assert [_post(site, "/click", "colour=blue")[0] for _ in range(2)] == [303, 303]
        ok, line = site.grade()
        assert not ok and '"clicks": ["blue", "blue"]' in line
        status, headers = _post(site, "/click", "colour=red")
        assert status == 303 and headers["Location"] == "/clicked"
        assert site.state() == {"clicks": ["blue", "blue", "red"]}
        assert not site.grade()[0]  # the expected list is the whole history, not its last click
    finally:
        site.close()
    assert not os.path.exists(site.folder)


def test_a_body_over_the_limit_is_refused_unread_and_changes_nothing() -> None:
    site = SiteSession(GuiTask(site="colour", expect_state={"clicks": ["red"]}))
    try:
        assert _post(site, "/click", "colour=red", length=MAX_BODY + 1)[0] == 413
        assert _post(site, "/click", "colour=purple")[0] == 400  # no such button
        assert site.state() == {"clicks": []}
        assert _post(site, "/click", "colour=red")[0] == 303
        assert site.grade() == (True, 'site state: ok: {"clicks": ["red"]}')
    finally:
        site.close()
