"""A local sandbox with a display (sandbox/gui.py): its screenshot shows the task site served on the host,
an xdotool click inside changes the site's state (read on the host), nothing beyond the sandbox's own
loopback is reachable from it (not by chromium either), and no Xvfb or chromium outlives the exec."""

from __future__ import annotations

import os
import shutil
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from openforge.config import LocalSandboxConfig
from openforge.errors import SandboxError
from openforge.rollouts.tasks.web.server import SiteSession
from openforge.rollouts.tasks.web.spec import GuiTask
from openforge.sandbox.gui import GuiSpec, find_chromium
from openforge.sandbox.local import LocalSandbox, bwrap_usable
from tests.helpers.required import requires

MISSING = [n for n, ok in (("chromium", find_chromium()), ("Xvfb", shutil.which("Xvfb")),
                           ("xdotool", shutil.which("xdotool")), ("bwrap", bwrap_usable())) if not ok]
pytestmark = requires("chromium", f"needs {', '.join(MISSING)} (apt-get install chromium xvfb xdotool bubblewrap)"
                      if MISSING else None)

COLOUR = GuiTask(site="colour", params={"order": ["blue", "yellow", "green", "red"]}, expect_state={"clicks": ["red"]})

# Inside the sandbox: find the red button IN THE SCREENSHOT, click its centre, wait for the grey page.
CLICK_RED = r'''
import os, subprocess, sys
sys.path.insert(0, os.path.dirname(os.environ["FORGE_GUI"]))
import gui
gui.wait_painted()
img = gui.screenshot()
img.save("shot.png")
w, h = img.size
pts = [(x, y) for y in range(0, h, 8) for x in range(0, w, 8) if img.getpixel((x, y)) == (230, 0, 0)]
x = sum(p[0] for p in pts) // len(pts); y = sum(p[1] for p in pts) // len(pts)
print("red at", x, y, len(pts))
gui.click(x, y)
gui.wait_colour(512, 384, (128, 128, 128))
'''


def _sandbox(tmp_path: Path, rid: str, **cfg: Any) -> LocalSandbox:
    return LocalSandbox(LocalSandboxConfig(**cfg), run_id="gui-test", rollout_id=rid, root=tmp_path / "sb")


def _marked(sandbox_id: str) -> list[str]:
    """Command lines of the processes still carrying this sandbox's environment marker."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"OPENFORGE_SANDBOX={sandbox_id}".encode() in env.split(b"\0"):
            out.append(cmd)
    return out


async def test_screenshot_and_click_change_the_site_state(tmp_path: Path) -> None:
    site = SiteSession(COLOUR)
    try:
        async with _sandbox(tmp_path, "gui-click") as sb:
            sb.attach_gui(site.gui_spec())
            await sb.write_file("click.py", CLICK_RED.encode())
            done = await sb.exec('"$FORGE_PYTHON" click.py && echo "display=$DISPLAY site=$FORGE_SITE_URL"',
                                 timeout=120)
            assert done.exit_code == 0, done.stderr
            assert "site=http://127.0.0.1:8080/" in done.stdout and "display=:" in done.stdout
            assert site.state() == {"clicks": ["red"]}  # seen on the host, in the site's own state
            assert site.grade()[0]
            from PIL import Image
            shot = Image.open(sb.dir / "work" / "shot.png")
            assert shot.size == (1024, 768)
            assert shot.getpixel((16 + 512 + 240, 16 + 384 + 176)) == (230, 0, 0)  # red: bottom-right quadrant
    finally:
        site.close()


# Inside: the host's TCP server by its loopback and its outside address, plain and through chromium.
PROBE = r'''
import socket, subprocess, sys
port, host_ip = int(sys.argv[1]), sys.argv[2]
for addr in ("127.0.0.1", host_ip):
    try:
        socket.create_connection((addr, port), timeout=3).close()
        print("REACHED", addr)
    except OSError as exc:
        print("blocked", addr, type(exc).__name__)
for url in (f"http://{host_ip}:{port}/", f"http://127.0.0.1:{port}/", "http://127.0.0.1:8080/"):
    out = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--user-data-dir=/tmp/p",
                          "--dump-dom", url], capture_output=True, text=True, timeout=60).stdout
    print("DOM", url, "HOSTPAGE" in out, "Corner Shop" in out)
'''


def _outside_ip() -> str | None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.1", 9))  # no packet is sent: only the route's source address is chosen
        ip = s.getsockname()[0]
    except OSError:
        return None
    finally:
        s.close()
    return None if ip.startswith("127.") else ip


async def test_nothing_beyond_loopback_is_reachable(tmp_path: Path) -> None:
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            hits.append(self.path)
            body = b"<html><body>HOSTPAGE</body></html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("0.0.0.0", 0), Handler)  # noqa: S104 - the test's target, on every address
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host_ip = _outside_ip() or "127.0.0.1"
    site = SiteSession(GuiTask(site="shop", params={"products": [{"sku": "a", "name": "A", "price": 1.0}]}))
    try:
        async with _sandbox(tmp_path, "gui-net") as sb:
            sb.attach_gui(site.gui_spec())
            await sb.write_file("probe.py", PROBE.encode())
            done = await sb.exec(["sh", "-c", f'"$FORGE_PYTHON" probe.py {server.server_address[1]} {host_ip}'],
                                 timeout=180)
            assert done.exit_code == 0, done.stderr
            out = done.stdout
            assert "REACHED" not in out, out
            assert f"DOM http://{host_ip}:{server.server_address[1]}/ False" in out
            assert f"DOM http://127.0.0.1:{server.server_address[1]}/ False" in out
            assert "DOM http://127.0.0.1:8080/ False True" in out  # the positive control: the site is there
            assert hits == []  # the host server never saw a request from the sandbox
    finally:
        site.close()
        server.shutdown()
        server.server_close()


async def test_no_display_or_browser_outlives_the_exec(tmp_path: Path) -> None:
    async with _sandbox(tmp_path, "gui-kill") as sb:
        sb.attach_gui(GuiSpec(url="data:text/html,<h1>hi</h1>"))
        # a browser detached into its own session, then the exec times out while the display runs
        done = await sb.exec('setsid chromium --no-sandbox --headless --disable-gpu --user-data-dir=/tmp/q '
                             'about:blank >/dev/null 2>&1 & sleep 600', timeout=20)
        assert done.timed_out
        await sb.kill_all()
        assert _marked(sb.id) == []
        ok = await sb.exec("true", timeout=60)  # and the next exec gets a display again
        assert ok.exit_code == 0, ok.stderr
        assert _marked(sb.id) == []


async def test_attach_gui_needs_isolation(tmp_path: Path) -> None:
    async with _sandbox(tmp_path, "gui-none", isolation="none") as sb:
        with pytest.raises(SandboxError, match="bubblewrap"):
            sb.attach_gui(GuiSpec())
