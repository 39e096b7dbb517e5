"""Whether chromium takes a click the moment its page is painted (sandbox/gui.py's launch): with
PaintHolding on (chromium's default, gui.py's flags before issue 32's fix) and off (CHROMIUM_FLAGS now).
Each try is a fresh Xvfb and chromium in kiosk mode on a local page whose own listeners report every
pointer event; an xdotool click the moment `wait_painted` returns is taken when the page saw it and
turned green. A second fresh launch per try moves the pointer every 50 ms from the paint on: how long
until the page saw the first move (the moment input is dropped).

    python -m bench gui_first_click [--quick]        (needs chromium, Xvfb and xdotool on this machine)
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from openforge.sandbox import gui  # noqa: E402

GREEN = (0, 160, 0)
# Red; a click on the top-left quarter turns it green (a script: no navigation). Every pointer event is
# reported to the page's server (an image request), so a dropped click is told from a slow repaint.
PAGE = ("<!doctype html><html><head><style>body { margin: 0; background: rgb(255,0,0); } "
        "#go { position: absolute; left: 0; top: 0; width: 50vw; height: 50vh; }</style></head><body>"
        "<div id=\"go\" onclick=\"document.body.style.background = 'rgb(0,160,0)'\"></div><script>"
        "for (const t of ['mousemove', 'mousedown', 'click']) window.addEventListener(t, "
        "() => { new Image().src = '/event?' + t + '&' + Math.random(); }, true);</script></body></html>")


class _Page:
    def __init__(self) -> None:
        self.events: list[tuple[float, str]] = []
        page = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path.startswith("/event?"):
                    page.events.append((time.monotonic(), self.path[7:].split("&")[0]))
                    self.send_response(204)
                    self.end_headers()
                    return
                data = PAGE.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _launch(page: _Page, flags: tuple[str, ...]):  # type: ignore[no-untyped-def]
    """(Xvfb, chromium, DISPLAY, the moment the page was painted), with these chromium flags."""
    xvfb, display = gui.start_xvfb(1024, 768)
    saved = gui.CHROMIUM_FLAGS
    gui.CHROMIUM_FLAGS = flags
    try:
        browser = gui.start_chromium(display, page.url, mode="kiosk", width=1024, height=768)
    finally:
        gui.CHROMIUM_FLAGS = saved
    try:
        gui.wait_painted(60.0, display)
    except gui.GuiError:
        gui._end(browser)
        gui._end(xvfb)
        raise
    return xvfb, browser, display, time.monotonic()


def _first_click(page: _Page, flags: tuple[str, ...]) -> dict:
    page.events.clear()
    xvfb, browser, display, _ = _launch(page, flags)
    try:
        gui.xdotool("mousemove", "--sync", "256", "192", "click", "1", display=display)
        deadline, green = time.monotonic() + 5.0, False
        while time.monotonic() < deadline and not green:
            green = gui.screenshot(display).getpixel((256, 192)) == GREEN
            time.sleep(0.05)
        time.sleep(0.2)  # the last reports in flight
        return {"taken": green and any(kind == "click" for _, kind in page.events),
                "page_saw_events": sorted({kind for _, kind in page.events})}
    finally:
        gui._end(browser)
        gui._end(xvfb)


def _first_move_after_paint_s(page: _Page, flags: tuple[str, ...]) -> float | None:
    page.events.clear()
    xvfb, browser, display, painted = _launch(page, flags)
    try:
        k = 0
        while not page.events and time.monotonic() - painted < 10.0:
            k += 1  # a new point each time: `mousemove --sync` to where the pointer is waits ~15 s
            gui.xdotool("mousemove", "--sync", str(300 + k % 2), "300", display=display)
            time.sleep(0.05)
        return round(page.events[0][0] - painted, 3) if page.events else None
    finally:
        gui._end(browser)
        gui._end(xvfb)


def run(quick: bool = False) -> dict:
    missing = [t for t in ("Xvfb", "xdotool") if not subprocess.run(["which", t], capture_output=True).returncode == 0]
    if missing or gui.find_chromium() is None:
        raise RuntimeError(f"needs chromium, Xvfb and xdotool here (missing: {missing or ['chromium']})")
    tries = 3 if quick else 6
    now = gui.CHROMIUM_FLAGS
    before = tuple(f.replace(",PaintHolding", "") if f.startswith("--disable-features=") else f for f in now)
    assert before != now, "CHROMIUM_FLAGS no longer disables PaintHolding"
    version = subprocess.run([gui.find_chromium() or "chromium", "--version"], capture_output=True, text=True,
                             env={**os.environ, "HOME": "/tmp"}).stdout.strip()
    page = _Page()
    rows = []
    try:
        for name, flags in (("PaintHolding on (chromium's default; before)", before),
                            ("PaintHolding off (CHROMIUM_FLAGS)", now)):
            clicks = [_first_click(page, flags) for _ in range(tries)]
            moves = [_first_move_after_paint_s(page, flags) for _ in range(tries)]
            seen = [m for m in moves if m is not None]
            row = {"flags": name, "tries": tries, "click at paint taken": sum(c["taken"] for c in clicks),
                   "page saw no event of it": sum(not c["page_saw_events"] for c in clicks),
                   "first move seen, s after paint (median)": round(statistics.median(seen), 3) if seen else None,
                   "first move seen, s after paint (max)": max(seen) if seen else None}
            print(row, flush=True)
            rows.append(row)
    finally:
        page.close()
    return {"chromium": version, "rows": rows}


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv))
