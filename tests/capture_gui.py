"""Record what the GUI harnesses send (docs/harness-captures/mini-gui.jsonl, browser-use.jsonl): each
runs once on the one-button page against tests/capture_server.py (whose reply is the harness's `done`),
and the logged requests are written trimmed (strings over 300 characters cut, with their length).

    .venv/bin/python tests/capture_gui.py [--browser-use-python ~/.cache/openforge-npm/browser-use-venv/bin/python]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.* imports

import uvicorn  # noqa: E402

from tests.capture_server import create_capture_app  # noqa: E402
from tests.helpers.gui_fixtures import Site, chromium, red_centre, run_browser_use, run_mini_gui, wait_for, xvfb  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "docs" / "harness-captures"


def trim(x: Any) -> Any:
    if isinstance(x, str):
        return x if len(x) <= 300 else x[:200] + f"\u2026[{len(x)} chars]"
    if isinstance(x, list):
        return [trim(i) for i in x]
    if isinstance(x, dict):
        return {k: trim(v) for k, v in x.items()}
    return x


def capture(name: str, run: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "log.jsonl"
        server = uvicorn.Server(uvicorn.Config(create_capture_app(log, "true"), host="127.0.0.1", port=0,
                                               log_level="warning"))
        threading.Thread(target=server.run, daemon=True).start()
        wait_for(lambda: server.started, 30, "the capture server")
        port = server.servers[0].sockets[0].getsockname()[1]
        proc, record = run(Path(tmp), f"http://127.0.0.1:{port}/v1")
        server.should_exit = True
        print(name, proc.returncode, record)
        with open(OUT / f"{name}.jsonl", "w") as fh:
            for entry in (json.loads(line) for line in log.read_text().splitlines()):
                entry.pop("t", None)
                entry["body_bytes"] = len(json.dumps(entry["body"])) if entry.get("body") is not None else 0
                fh.write(json.dumps(trim(entry)) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--browser-use-python", default=str(Path.home() / ".cache/openforge-npm/browser-use-venv/bin/python"))
    args = ap.parse_args()
    site = Site()
    try:
        with xvfb(1280, 800) as display, chromium(display, site.url, 1280, 800):
            from PIL import ImageGrab
            wait_for(lambda: red_centre(ImageGrab.grab(xdisplay=display).resize((160, 100))), 90, "the page")
            capture("mini-gui", lambda wd, url: run_mini_gui(wd, display, url, "Press the red button."))
        capture("browser-use", lambda wd, url: run_browser_use(args.browser_use_python, wd, url,
                                                               f"Open {site.url} and press the red button."))
    finally:
        site.close()


if __name__ == "__main__":
    main()
