"""A small mock mail API for the task-service tests: the standard library only, listening on $PORT.

    GET  /health            200 once up          POST /send   {"to", "subject"} -> {"id": n}
    POST /reset             clears the outbox    GET  /outbox the messages sent so far

MAIL_BROKEN=1 makes /health answer 503 for ever (a service that never becomes healthy).
"""

import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

OUTBOX: list[dict] = [{"to": "fixture@example.org", "subject": "left from a previous run"}]


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _reply(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            broken = os.environ.get("MAIL_BROKEN") == "1"
            return self._reply(503 if broken else 200, {"ok": not broken})
        if self.path == "/outbox":
            return self._reply(200, {"messages": OUTBOX})
        self._reply(404, {"error": "no such path"})

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/reset":
            OUTBOX.clear()
            return self._reply(200, {"reset": True})
        if self.path == "/send":
            try:
                message = json.loads(body or b"{}")
            except ValueError:
                return self._reply(400, {"error": "body must be JSON"})
            if not isinstance(message, dict) or not message.get("to"):
                return self._reply(422, {"error": "'to' is required"})
            OUTBOX.append(message)
            return self._reply(200, {"id": len(OUTBOX)})
        self._reply(404, {"error": "no such path"})


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
