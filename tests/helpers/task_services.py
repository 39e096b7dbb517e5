"""Task services' tests: the mail service's task and a reader of its mailbox."""

from __future__ import annotations

import os

from tests.helpers.paths import DATA
from openforge.rollouts.tasks.format import TaskSpec
from openforge.rollouts.tasks.services import ServiceSpec


SERVER = (DATA / "services" / "mail_server.py").read_text()


def _mail(**over: object) -> ServiceSpec:
    spec = {"name": "mail", "command": "python mail_server.py", "files": {"mail_server.py": SERVER},
            "health": {"method": "GET", "path": "/health"}, "reset": {"method": "POST", "path": "/reset"},
            "ready_timeout_s": 10}
    return ServiceSpec.model_validate({**spec, **over})


def _task(**over: object) -> TaskSpec:
    record = {"id": "mail-bob", "instruction": "Email bob@example.org.", "services": [_mail().model_dump()],
              "expect_requests": [{"service": "mail", "method": "POST", "path": "/send",
                                   "body": {"to": "bob@example.org"}}]}
    return TaskSpec.model_validate({**record, **over})


# The agent's side: a POST to the service from inside the sandbox, at the URL the runner gave it.
SEND = """python3 - <<'PY'
import json, os, urllib.error, urllib.request
url = os.environ["FORGE_SERVICE_MAIL_URL"] + "/send"
for attempt in range(ATTEMPTS):
    req = urllib.request.Request(url, data=json.dumps({"to": "bob@example.org"}).encode(),
                                 headers={"Content-Type": "application/json", "X-Forge-Tool": "send_mail"})
    try:
        print(urllib.request.urlopen(req, timeout=10).status)
        break
    except urllib.error.HTTPError as exc:
        print(exc.code)
PY
"""
