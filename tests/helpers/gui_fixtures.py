"""Test helpers for the GUI harnesses: a real X display (Xvfb), a real browser (chromium) showing a tiny
stateful site, and a scripted model that speaks the OpenAI Chat Completions protocol faithfully
(reply objects as the API returns them, tool calls with ids, finish reasons, error bodies).

The scripted model is the one fake: it stands where a vision model would, and it reads the screenshots
it is sent (PNG data URLs) to decide where to click, so a test fails if the screenshot or the
coordinate mapping is wrong."""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import socketserver
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.helpers.paths import REPO
from tests.helpers.required import requires


GUI_TOOLS = ("Xvfb", "xdotool", "chromium")


def missing_gui_tools() -> list[str]:
    return [t for t in GUI_TOOLS if shutil.which(t) is None]


def wait_for(cond: Callable[[], Any], timeout: float, what: str, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


@contextmanager
def xvfb(width: int = 800, height: int = 600) -> Iterator[str]:
    """A fresh Xvfb display; yields its DISPLAY (':N'), chosen by Xvfb itself (-displayfd). -noreset: an X
    server otherwise resets when its last client disconnects, and a connection made meanwhile fails."""
    read, write = os.pipe()
    proc = subprocess.Popen(["Xvfb", "-displayfd", str(write), "-screen", "0", f"{width}x{height}x24",
                             "-nolisten", "tcp", "-noreset"], pass_fds=(write,), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    os.close(write)
    try:
        with os.fdopen(read) as fh:
            number = fh.readline().strip()  # written once the server accepts connections
        if not number:
            raise AssertionError(f"Xvfb did not start (exit code {proc.poll()})")
        yield f":{number}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextmanager
def chromium(display: str, url: str, width: int = 800, height: int = 600) -> Iterator[subprocess.Popen]:
    """chromium in kiosk mode (the page fills the screen: screen pixels are page pixels)."""
    profile = tempfile.mkdtemp(prefix="forge-chromium-")
    proc = subprocess.Popen(
        ["chromium", "--no-sandbox", "--kiosk", "--no-first-run", "--no-default-browser-check", "--disable-gpu",
         "--disable-extensions", "--disable-sync", "--disable-background-networking", "--password-store=basic",
         f"--user-data-dir={profile}", "--window-position=0,0", f"--window-size={width},{height}", url],
        env={**os.environ, "DISPLAY": display}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        shutil.rmtree(profile, ignore_errors=True)


# -- a tiny stateful site: one red button; a click (a POST) turns the page green ---------------------

BUTTON = (300, 250, 500, 350)  # x0, y0, x1, y1 in page pixels
PAGE = """<!doctype html><html><head><style>
body {{ margin: 0; background: {bg}; }}
#go {{ position: absolute; left: 300px; top: 250px; width: 200px; height: 100px; border: 0;
       background: rgb(255,0,0); }}
</style></head><body>{body}</body></html>"""


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self):  # type: ignore[no-untyped-def]
        conn, _ = super().get_request()
        return conn, ("sandbox", 0)  # BaseHTTPRequestHandler wants a (host, port) client address


class Site:
    """The button site on 127.0.0.1 (a port), or on a unix socket `unix` (what a GUI sandbox forwards
    to its own 127.0.0.1:8080: sandbox/gui.py)."""

    def __init__(self, unix: str | None = None) -> None:
        self.clicks = 0
        self.gets = 0
        site = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _page(self) -> None:
                done = site.clicks > 0
                html = PAGE.format(bg="rgb(0,160,0)" if done else "white", body="" if done else
                                   '<form method="post" action="/click"><button id="go" type="submit"></button></form>')
                data = html.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                site.gets += 1
                self._page()

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                site.clicks += 1
                self._page()

        if unix:
            self.server: Any = _UnixHTTPServer(unix, Handler)
            self.url = "http://127.0.0.1:8080/"
        else:
            self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- a scripted model behind the OpenAI Chat Completions API -----------------------------------------

def screenshot_of(body: dict[str, Any]) -> Any:
    """The PIL image of the (last) image_url data URL in a Chat request."""
    from PIL import Image
    url = None
    for msg in body["messages"]:
        if isinstance(msg.get("content"), list):
            for part in msg["content"]:
                if part.get("type") == "image_url":
                    url = part["image_url"]["url"]
    assert url and url.startswith("data:image/png;base64,"), "no PNG data URL in the request"
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))


def red_centre(image: Any) -> tuple[int, int] | None:
    """The centre of the pure-red pixels of an image (the button), or None."""
    rgb = image.convert("RGB")
    w, h = rgb.size
    px = rgb.load()
    xs, ys = [], []
    for y in range(0, h):
        for x in range(0, w):
            r, g, b = px[x, y]
            if r > 200 and g < 60 and b < 60:
                xs.append(x)
                ys.append(y)
    if not xs:
        return None
    return (min(xs) + max(xs)) // 2, (min(ys) + max(ys)) // 2


def tool_call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
         "function": {"name": name, "arguments": json.dumps(args)}}]}


def text_reply(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


class ScriptedModel:
    """An OpenAI-compatible /v1/chat/completions endpoint; `policy(body)` returns the assistant message,
    or (status, error message) for an API error. Every request body is kept in `requests`."""

    def __init__(self, policy: Callable[[dict[str, Any]], Any]) -> None:
        self.requests: list[dict[str, Any]] = []
        self.auth: list[str] = []
        model = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _json(self, status: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                if not self.path.endswith("/chat/completions"):
                    self._json(404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error"}})
                    return
                model.requests.append(body)
                model.auth.append(self.headers.get("Authorization", ""))
                reply = policy(body)
                if isinstance(reply, tuple):
                    status, message = reply
                    self._json(status, {"error": {"message": message, "type": "invalid_request_error",
                                                  "param": None, "code": None}})
                    return
                finish = "tool_calls" if reply.get("tool_calls") else "stop"
                self._json(200, {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion",
                                 "created": int(time.time()), "model": body.get("model"),
                                 "choices": [{"index": 0, "message": reply, "logprobs": None,
                                              "finish_reason": finish}],
                                 "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def run_mini_gui(workdir: Path, display: str, base_url: str, instruction: str, *args: str,
                 timeout: float = 120) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
    """Run mini_gui_agent.py as the harness does (a fresh process in `workdir`); (process, result record)."""
    import sys
    agent = REPO / "rollouts" / "harnesses" / "mini_gui_agent.py"
    (workdir / ".forge").mkdir(parents=True, exist_ok=True)
    (workdir / ".forge" / "instruction.txt").write_text(instruction)
    env = {"PATH": os.environ["PATH"], "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "sk-rollout-test",
           "FORGE_MODEL": "forge-policy", "PYTHONUNBUFFERED": "1"}
    if display:
        env["DISPLAY"] = display
    proc = subprocess.run([sys.executable, str(agent), "--instruction-file", ".forge/instruction.txt", *args],
                          cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
    result = workdir / ".forge" / "mini_gui_result.json"
    return proc, (json.loads(result.read_text()) if result.exists() else {})


# -- browser-use ------------------------------------------------------------------------------------

def browser_use_reply(actions: list[dict[str, Any]]) -> dict[str, Any]:
    """An assistant message as browser-use asks for it (response_format: its AgentOutput JSON schema)."""
    return text_reply(json.dumps({"thinking": "", "evaluation_previous_goal": "", "memory": "", "next_goal": "",
                                  "action": actions}))


def browser_use_button_policy(body: dict[str, Any]) -> dict[str, Any]:
    """Click the element browser-use lists as `[N]<button id=go` while the page has it, then done."""
    import re
    text = "".join(p.get("text", "") for m in body["messages"] if m["role"] == "user"
                   for p in (m["content"] if isinstance(m["content"], list) else [{"text": m["content"]}]))
    found = re.search(r"\[(\d+)\]<button id=go", text)
    if found:
        return browser_use_reply([{"click": {"index": int(found.group(1))}}])
    return browser_use_reply([{"done": {"text": "clicked", "success": True, "files_to_display": []}}])


def run_browser_use(python: str, workdir: Path, base_url: str, instruction: str, *args: str,
                    timeout: float = 240) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
    """Run browser_use_agent.py with the harness venv's python, as the adapter does."""
    from openforge.rollouts.harnesses import harness_class
    from openforge.sandbox.gui import find_chromium

    spec_env = harness_class("browser-use").spec.run.env  # its quiet switches, as the harness sets them
    agent = REPO / "rollouts" / "harnesses" / "browser_use_agent.py"
    (workdir / ".forge").mkdir(parents=True, exist_ok=True)
    (workdir / ".forge" / "instruction.txt").write_text(instruction)
    (workdir / "home").mkdir(exist_ok=True)
    # browser-use leaves an agent and a downloads folder in $TMPDIR: one of ours, short (chromium's
    # singleton socket goes there too, and a unix socket's path has at most 107 bytes)
    tmp = tempfile.mkdtemp(prefix="forge-bu-")
    env = {**spec_env, "PATH": os.environ["PATH"], "HOME": str(workdir / "home"), "TMPDIR": tmp,
           "OPENAI_BASE_URL": base_url,
           "OPENAI_API_KEY": "sk-rollout-test", "FORGE_MODEL": "forge-policy", "FORGE_CHROMIUM": find_chromium() or "",
           "PYTHONUNBUFFERED": "1"}
    try:
        proc = subprocess.run([python, str(agent), "--instruction-file", ".forge/instruction.txt", *args],
                              cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result = workdir / ".forge" / "browser_use_result.json"
    return proc, (json.loads(result.read_text()) if result.exists() else {})


def run_gui_task(store: Any, tiny_vl_model: Path, script: Any, task_id: str, harness: Any,
                 sandbox: Any = None, judge: Any = None, task_judge: Any = None, task: Any = None) -> Any:
    """One rollout of a builtin-web task by the real RolloutRunner (the site served on the host, the
    GUI attached to the harness's exec), through the real proxy to a ScriptedEngine on the tiny Qwen2-VL.
    `script(engine, input_ids) -> text`, or a list of texts; `sandbox`: a sandbox config (default: a
    local one, in bubblewrap); `judge`, `task_judge`: a [judge] config and a judge component added to
    the task; `task`: a TaskSpec to run instead of builtin-web's `task_id`. (rollout row, engine)"""
    import asyncio

    import pytest

    from openforge.engine.scripted import ScriptedEngine
    from openforge.engine.serve import serve_in_thread
    from openforge.config import ForgeConfig
    from openforge.proxy.server import ProxyServer
    from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
    from openforge.rollouts.tasks.format import load_tasks
    from openforge.sandbox.local import bwrap_usable
    from openforge.sandbox.testing import proxy_socket_path

    if sandbox is None and not bwrap_usable():
        pytest.skip("needs bubblewrap (a GUI sandbox is isolated)")
    engine: Any = None
    engine = ScriptedEngine(tiny_vl_model, (lambda ids: script(engine, ids)) if callable(script) else script)
    cfg = ForgeConfig()
    if sandbox is not None:
        cfg.sandbox = sandbox
    cfg.harness = harness
    cfg.proxy.max_context_tokens = 65536
    cfg.runner.time_limit_scale = 5.0
    if judge is not None:
        cfg.judge = judge
    task = task or next(t for t in load_tasks("builtin-web") if t.id == task_id)
    if task_judge is not None:
        task = task.model_copy(update={"judge": task_judge})
    with serve_in_thread(engine.app) as eng, ProxyServer(cfg.proxy, store_path=store.path, engine_url=eng.url,
                                                          model_path=tiny_vl_model, uds=proxy_socket_path()) as proxy:
        run = store.create_run(kind="eval")
        runner = RolloutRunner(store, config=cfg, proxy_url=proxy.url, proxy_socket=proxy.uds)
        [ro] = asyncio.run(runner.run(run.id, [RolloutSpec(task)]))
    return ro, engine


needs_display = requires("chromium", f"needs {', '.join(missing_gui_tools())} (apt-get install xvfb xdotool chromium)"
                         if missing_gui_tools() else None)
