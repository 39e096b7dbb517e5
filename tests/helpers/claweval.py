"""A stand-in ClawEval agent that calls the task's notes service (errors retried)."""

from __future__ import annotations

import json


# The agent's calls, made from inside the sandbox at the service URL the runner gives it.
CALL = """python3 - <<'PY'
import json, os, urllib.error, urllib.request
base = os.environ["FORGE_SERVICE_NOTES_URL"]
for path, body in CALLS:
    for attempt in range(8):  # the service's injected errors (its ERROR_RATE) are retried
        req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=10)
            break
        except urllib.error.HTTPError as exc:
            print(path, exc.code)
PY
"""


def _agent(calls: list) -> str:
    return CALL.replace("CALLS", repr(calls))
