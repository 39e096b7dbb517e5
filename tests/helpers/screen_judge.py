"""A scripted judge of screenshots served on loopback, for the tests of judged GUI tasks."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import Any

import pytest

from openforge.image_store import image_format
from tests.helpers.judges import ScriptedJudge


class _ScreenJudge(ScriptedJudge):
    """POST /v1/chat/completions. It decodes every image part it is sent (a data URL of PNG bytes),
    keeps their sha256s in order, and answers by its model name's verdict format: SUCCESS when it was
    sent exactly `want` images inside the quoted block (model `webvoyager-2`: 2), else NOT SUCCESS."""

    seen: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        shas, inside, quoted = [], 0, False
        for part in body["messages"][1]["content"]:
            if part["type"] == "text" and part["text"].startswith("<<<BEGIN DATA"):
                quoted = True
            elif part["type"] == "text" and part["text"].startswith("<<<END DATA"):
                quoted = False
            elif part["type"] == "image_url":
                head, data = part["image_url"]["url"].split(",", 1)
                raw = base64.b64decode(data)
                assert head == f"data:image/{image_format(raw)};base64"
                shas.append(hashlib.sha256(raw).hexdigest())
                inside += quoted
        type(self).seen.append({"body": body, "shas": shas})
        name, want = body["model"].rsplit("-", 1)
        ok = len(shas) == inside == int(want)
        reply = {"webvoyager": "The final screen shows it.\nSUCCESS" if ok else "Not shown.\nNOT SUCCESS",
                 "webjudge": f'Thoughts: checked.\nStatus: "{"success" if ok else "failure"}"'}[name]
        self.reply(body["model"], reply)


@pytest.fixture(scope="module")
def judge_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ScreenJudge)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
