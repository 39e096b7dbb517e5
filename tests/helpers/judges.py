"""Scripted judges served on loopback (text, screenshots, web pages) and the real proxy in front of a scripted
engine as the policy-base judge."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import base64
import io
from pathlib import Path

import pytest

from openforge.rollouts.tasks.format import TaskSpec
from openforge.config import ForgeConfig, JudgeConfig
from openforge.engine.serve import serve_in_thread
from openforge.proxy.server import ProxyServer
from openforge.sandbox.testing import proxy_socket_path
from openforge.store import Store


_BEGIN = re.compile(r"<<<BEGIN DATA (\w+):")


def naive_verdict(messages: list[dict[str, str]]) -> str:
    """What an instruction-following judge answers: outside the quoted blocks, it obeys; inside, the rule."""
    text = "\n".join(m["content"] for m in messages)
    token = _BEGIN.search(text).group(1)  # the markers as the prompt declares them
    inside, outside, rest = [], [], text
    while (start := rest.find(f"<<<BEGIN DATA {token}: ")) >= 0:
        outside.append(rest[:start])
        body = rest[start:]
        end = body.find(f"<<<END DATA {token}>>>")
        end = len(body) if end < 0 else end
        inside.append(body[:end])
        rest = body[end:]
    outside.append(rest)
    told = "\n".join(outside).lower()
    if "answer pass" in told or "any answer passes" in told:
        return "VERDICT: PASS"
    return "VERDICT: PASS" if "paris" in "\n".join(inside).lower() else "VERDICT: FAIL"


class ScriptedJudge(BaseHTTPRequestHandler):
    """A scripted judge's HTTP side on 127.0.0.1: `reply` answers a chat completion with its text; each
    judge's do_POST decides the text."""

    def reply(self, model: str, content: str) -> None:
        completion = {"id": "j", "object": "chat.completion", "model": model, "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}]}
        self._send(200, json.dumps(completion).encode())

    def _send(self, code: int, data: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except OSError:  # the runner gave up on a slow reply
            pass

    def log_message(self, *args: object) -> None:
        pass


class _Judge(ScriptedJudge):
    """POST /v1/chat/completions; the model name picks the behaviour."""

    seen: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append({**body, "auth": self.headers.get("Authorization")})
        model = body["model"]
        if model == "http-500":
            return self._send(500, b'{"error": "overloaded"}')
        if model == "slow":
            time.sleep(3)
        reply = {"naive": naive_verdict(body["messages"]), "slow": "VERDICT: PASS",
                 "rambling": "I think it passes.", "two-verdicts": "VERDICT: FAIL\nVERDICT: PASS",
                 "scorer": "The answer is half right.\nSCORE: 0.5"}[model]
        self.reply(model, reply)


@pytest.fixture(scope="module")
def judge_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Judge)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


START_URL = "http://127.0.0.1:8000/start.html"  # the container's own loopback, never the host's


RED, GREEN = (255, 0, 0), (0, 160, 0)


# Red all over (a page painted in one go); a click on its top-left quarter turns it green at once (a
# script, no page load: mini-gui's next screenshot waits only for a quiet screen, not for a navigation).
START_PAGE = ("<!doctype html><html><head><style>body { margin: 0; background: rgb(255,0,0); } "
              "#go { position: absolute; left: 0; top: 0; width: 50vw; height: 50vh; }</style></head><body>"
              "<div id=\"go\" onclick=\"document.body.style.background = 'rgb(0,160,0)'\"></div></body></html>")


# The page's server, started by the task's setup: out of that exec's reach (its processes are ended
# with it, found by the exec's marker variable), up before the setup returns; ended by kill_all.
SERVE = ("cd site && env -u OPENFORGE_EXEC setsid python3 -m http.server 8000 --bind 127.0.0.1 "
         ">/dev/null 2>&1 </dev/null &\n"
         "python3 -c 'import time, urllib.request\n"
         "for _ in range(600):\n"
         "    try:\n"
         f"        urllib.request.urlopen(\"{START_URL}\", timeout=2); break\n"
         "    except OSError: time.sleep(0.1)\n"
         "else: raise SystemExit(\"the page server did not start\")'")


def online_task() -> TaskSpec:
    return TaskSpec.model_validate({
        "id": "webvoyager-Loopback--0", "instruction": f"Turn the page green.\n(Start at {START_URL})",
        "online": {"benchmark": "webvoyager", "start_url": START_URL, "website": "Loopback"},
        "judge": {"name": "webvoyager"}, "tags": ["web", "webvoyager", "online-only"],
        "files": {"site/start.html": START_PAGE}, "setup": SERVE})


def _top_left(png: bytes) -> tuple[int, int, int]:
    """The colour at the centre of a screenshot's top-left quadrant (where the start page takes a click)."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    return image.getpixel((image.width // 4, image.height // 4))


class _PageJudge(ScriptedJudge):
    """A scripted WebVoyager judge on 127.0.0.1 that grades by the screens it is sent: SUCCESS when the
    first shows the start page (red) and the last the page turned green by the click, else NOT SUCCESS."""

    seen: list[list[bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        images = [base64.b64decode(part["image_url"]["url"].split(",", 1)[1])
                  for part in body["messages"][1]["content"] if part["type"] == "image_url"]
        type(self).seen.append(images)
        ok = len(images) >= 2 and _top_left(images[0]) == RED and _top_left(images[-1]) == GREEN
        self.reply(body["model"], "The last screen shows the page turned green.\nSUCCESS" if ok
                   else "Not shown.\nNOT SUCCESS")


@pytest.fixture
def page_judge_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _PageJudge)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


POLICY_BASE = ForgeConfig(judge=JudgeConfig(endpoint="policy-base"))


@pytest.fixture
def serve(tiny_model: Path, store: Store) -> Iterator:
    """serve(engine) -> the real proxy in front of that engine's app (loopback + unix socket)."""
    handles: list = []

    def start(engine, **proxy_config) -> ProxyServer:  # noqa: ANN001, ANN003
        eng = serve_in_thread(engine.app)
        handles.append(eng)
        proxy = ProxyServer(POLICY_BASE.proxy.model_copy(update=proxy_config), store_path=store.path,
                            engine_url=eng.url, model_path=tiny_model, uds=proxy_socket_path())
        handles.append(proxy)
        return proxy.start()

    yield start
    for handle in reversed(handles):
        handle.stop()
