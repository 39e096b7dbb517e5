"""A sandbox's X display and browser, and the primitives to see and act in them (runs INSIDE the sandbox).

Interface (for harnesses, reference solutions and tests; stdlib, plus Pillow for screenshots):

    # the launcher: the sandbox wraps a command with it when a GUI is attached (sandbox/local.py)
    python -I gui.py run [--size 1024x768] [--kiosk URL | --app URL] [--start SCRIPT] [--finish SCRIPT]
                         [--budget SECONDS] -- CMD...
        starts Xvfb on a display of its own (-displayfd: Xvfb picks the number), sets DISPLAY, starts
        chromium on URL (--kiosk: the page fills the screen, so screen pixels are page pixels; --app: a
        bare application window, the "desktop" tasks), waits until the page is painted, then runs CMD
        and exits with CMD's exit code (Xvfb and chromium are ended with it). --start: a desktop task's
        shell script, run on the display before CMD (what it starts in the background, the task's
        applications, lives as long as the display); CMD starts once a window shows (within 60 s of the
        script's start). The launcher's own failures (no Xvfb, a start script that exits non-zero, nothing
        shown) exit 4 before CMD runs. --finish: a desktop task's shell script run on the display once CMD
        has exited by itself (OSWorld's save step, up to 60 s), before the display ends; not after a TERM,
        a CMD killed by a signal or one past its budget. Its failure is one line on stderr: the exit code
        stays CMD's. --budget: CMD's own time limit, kept by the launcher from CMD's start (the start and
        the finish run outside it): CMD past it is ended and the launcher exits 124 (HARNESS_TIMED_OUT),
        the one report of the harness's time the host reads (rollouts/runner/harness_run.py).

    # the primitives (DISPLAY from the environment unless given)
    python -I gui.py screenshot OUT.png          a PNG of the whole screen (Pillow's ImageGrab over XCB)
    python -I gui.py click X Y                   xdotool: move to (X, Y) in screen pixels, left click
    python -I gui.py type TEXT                   xdotool: type TEXT into the focused element
    python -I gui.py key COMBO                   xdotool: a key or combination (Return, ctrl+a, Tab)
    python -I gui.py wait-painted                until the screen is not one flat colour (max 30 s)
    python -I gui.py wait-colour X Y R,G,B       until pixel (X, Y) has that colour (max 30 s)

    from gui import screenshot, click, type_text, key     # the same, as functions (the file is
                                                          # at $FORGE_GUI inside a GUI sandbox)

Inside a sandbox with a GUI the environment holds DISPLAY, FORGE_GUI (this file's path) and
FORGE_PYTHON (a python that has Pillow); the task's site, when it has one, is at FORGE_SITE_URL
(http://127.0.0.1:8080/, a forwarder to the site's unix socket on the host: the site and its state
live outside the sandbox, see rollouts/tasks/web/).

Why chromium runs with --no-sandbox: its own sandbox needs to create user and pid namespaces (or a
setuid helper), which an unprivileged process inside bubblewrap's user namespace with every
capability dropped cannot do, so chromium would refuse to start. The rollout's sandbox is the
boundary instead: chromium runs in it with no network beyond the sandbox's own loopback (its own
network namespace), no host X socket, and only what the sandbox binds in.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace

SITE_PORT = 8080  # the task site's forwarder on the sandbox's own loopback
# The browser's start (until its page is drawn), a desktop's start (its script and first window) and its
# finish each have a time of their own, outside the command's --budget; the slack covers Xvfb's start, the
# finish's TERM grace and the display's end.
START_TIMEOUT_S = 60.0
FINISH_TIMEOUT_S = 60.0
LAUNCHER_SLACK_S = 30.0
HARNESS_TIMED_OUT = 124  # the launcher's exit code for a command past its --budget (coreutils timeout's)
SITE_URL = f"http://127.0.0.1:{SITE_PORT}/"
DEFAULT_SIZE = (1024, 768)
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# --test-type: without it chromium shows an infobar about --no-sandbox across the top of an --app window,
# which moves the page down 57 pixels (kiosk windows do not show it).
# PaintHolding off: with it, chromium drops every pointer event (moves too) for a moment after a page
# first shows (0.3 s past `wait_painted` here), so an agent's click that came early never reached the
# page (`python -m bench gui_first_click`; docs/gui.md). Only one --disable-features: the last one wins.
CHROMIUM_FLAGS = ("--no-sandbox", "--no-first-run", "--no-default-browser-check", "--disable-gpu",
                  "--disable-extensions", "--disable-sync", "--disable-background-networking",
                  "--disable-component-update", "--disable-default-apps", "--disable-translate",
                  "--disable-features=Translate,MediaRouter,OptimizationHints,PaintHolding", "--disable-dev-shm-usage",
                  "--password-store=basic", "--use-mock-keychain", "--no-pings", "--noerrdialogs",
                  "--disable-infobars", "--test-type", "--force-device-scale-factor=1", "--hide-scrollbars")


@dataclass(frozen=True)
class GuiSpec:
    """What a sandbox starts around a command when a GUI is attached (the host side's description)."""

    url: str | None = None  # the page chromium opens, as seen inside; None = a bare display
    mode: str = "kiosk"  # kiosk | app
    size: tuple[int, int] = DEFAULT_SIZE
    site_socket: str | None = None  # a host unix socket served at 127.0.0.1:SITE_PORT inside
    start: str | None = None  # a desktop task's script, run on the display before the command (--start)
    finish: str | None = None  # and one run on it after the command exits by itself (--finish)
    budget: float | None = None  # the command's own limit, kept by the launcher (--budget)

    def keeping(self, budget: float) -> "GuiSpec":
        """This spec with the launcher keeping the command's time limit when anything runs before or after
        the command (the site's browser until its page is drawn, a desktop's start and finish): they get
        their own time (START_TIMEOUT_S, FINISH_TIMEOUT_S), not the command's."""
        return replace(self, budget=budget) if self.url or self.start or self.finish else self

    def exec_timeout(self, budget: float) -> float:
        """The sandbox's limit for an exec of a command whose own limit is `budget`: the launcher's whole run."""
        return budget if self.budget is None else budget + START_TIMEOUT_S + FINISH_TIMEOUT_S + LAUNCHER_SLACK_S

    def launcher_args(self) -> list[str]:
        args = ["run", "--size", f"{self.size[0]}x{self.size[1]}"]
        if self.url:
            args += [f"--{self.mode}", self.url]
        if self.start:
            args += ["--start", self.start]
        if self.finish:
            args += ["--finish", self.finish]
        if self.budget is not None:
            args += ["--budget", f"{self.budget:g}"]
        return [*args, "--"]


class GuiError(Exception):
    """The display or the browser could not be started or used."""


def find_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _display(display: str | None) -> str:
    display = display or os.environ.get("DISPLAY", "")
    if not display:
        raise GuiError("no DISPLAY: this sandbox has no X display")
    return display


# -- primitives -------------------------------------------------------------------------------------

def screenshot(display: str | None = None):  # type: ignore[no-untyped-def]
    """The whole screen as a PIL image (RGB)."""
    from PIL import ImageGrab  # Pillow's wheels carry XCB support
    d = _display(display)
    try:
        return ImageGrab.grab(xdisplay=d).convert("RGB")
    except OSError as exc:
        raise GuiError(f"cannot take a screenshot of display {d}: {exc}") from None


def png(display: str | None = None) -> bytes:
    import io
    buf = io.BytesIO()
    screenshot(display).save(buf, format="PNG")
    return buf.getvalue()


def xdotool(*args: str, display: str | None = None, timeout: float = 30.0) -> str:
    done = subprocess.run(["xdotool", *args], env={**os.environ, "DISPLAY": _display(display)},
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise GuiError(f"xdotool {' '.join(args)} failed: {done.stderr.strip() or done.returncode}")
    return done.stdout


def pointer(*, display: str | None = None) -> tuple[int, int] | None:
    """Where the pointer is, or None when xdotool cannot say."""
    fields = dict(line.split("=", 1) for line in xdotool("getmouselocation", "--shell", display=display).splitlines()
                  if "=" in line)
    try:
        return int(fields["X"]), int(fields["Y"])
    except (KeyError, ValueError):
        return None


def click(x: int, y: int, *, button: int = 1, display: str | None = None) -> None:
    # `mousemove --sync` to where the pointer already is waits ~15 s for a motion that never comes
    move = [] if pointer(display=display) == (int(x), int(y)) else ["mousemove", "--sync", str(int(x)), str(int(y))]
    xdotool(*move, "click", str(button), display=display)


def type_text(text: str, *, display: str | None = None) -> None:
    xdotool("type", "--delay", "20", "--", text, display=display)


def key(combo: str, *, display: str | None = None) -> None:
    xdotool("key", "--", combo, display=display)


# An empty X screen (black); a browser window before its page: white, or GTK's window background
# (246, 245, 244), which Debian's chromium shows for a moment in the browser image.
BLANK = {(0, 0, 0), (255, 255, 255), (246, 245, 244)}


def wait_painted(timeout: float = 30.0, display: str | None = None, *, blank: frozenset | set = frozenset(BLANK),
                 what: str = "the browser did not draw the page") -> None:
    """Until the screen shows a colour other than black and white (a page is drawn: text is
    anti-aliased to greys, a flat red page is red), or GuiError. `blank`: the colours that count as
    nothing drawn (a desktop's: only the empty screen's black, since an X Toolkit editor is black on white)."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            shot = screenshot(display)
        except GuiError:
            shot = None
        colours = shot.getcolors(maxcolors=8) if shot is not None else []
        if colours is None or any(c not in blank for _, c in colours):
            data = shot.tobytes() if shot is not None else None
            if data == last:  # and the same a moment later: not mid-paint
                return
            last = data
        time.sleep(0.1)
    raise GuiError(f"the screen stayed blank for {timeout:g}s ({what})")


def wait_colour(x: int, y: int, rgb: tuple[int, int, int], timeout: float = 30.0, display: str | None = None) -> None:
    """Until the screen's pixel (x, y) is `rgb` (a page reacted to an action), or GuiError."""
    deadline, seen = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        seen = screenshot(display).getpixel((x, y))
        if tuple(seen) == tuple(rgb):
            return
        time.sleep(0.1)
    raise GuiError(f"pixel ({x}, {y}) stayed {seen}, not {tuple(rgb)}, for {timeout:g}s")


# -- the launcher -----------------------------------------------------------------------------------

def start_xvfb(width: int, height: int) -> tuple[subprocess.Popen, str]:
    """Xvfb on a display number it picks itself; returns (process, ':N') once it accepts connections.
    -nolisten tcp: only its unix socket (in the sandbox's own /tmp and network namespace). -noreset:
    otherwise it resets when its last client leaves, and a connection made meanwhile fails."""
    if not shutil.which("Xvfb"):
        raise GuiError("Xvfb is not installed (apt-get install xvfb)")
    read, write = os.pipe()
    proc = subprocess.Popen(["Xvfb", "-displayfd", str(write), "-screen", "0", f"{width}x{height}x24",
                             "-nolisten", "tcp", "-noreset"], pass_fds=(write,), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    os.close(write)
    with os.fdopen(read) as fh:
        number = fh.readline().strip()  # written once the server accepts connections
    if not number:
        raise GuiError(f"Xvfb did not start (exit code {proc.wait()})")
    try:
        disarm_server_keys(f":{number}")
    except GuiError:
        _end(proc)
        raise
    return proc, f":{number}"


# XKB actions that act on the X server itself. Any client may bind a keysym to a spare key (xdotool does
# for a keysym the keymap lacks) and the server then gives it the compat map's action: `xdotool key
# Terminate_Server` (or `0xfed5`) ended Xvfb, so a policy's one key action turned its rollout into a
# harness failure. Also the VT switches and XF86's private grab/log/video-mode actions.
_SERVER_ACTIONS = re.compile(r"\baction\s*=\s*(?:Terminate|SwitchScreen|Private)\s*\([^;]*\)\s*;")


def disarm_server_keys(display: str) -> None:
    """Reload the display's keymap with every server action replaced by NoAction (xkbcomp, ~25 ms)."""
    try:
        got = subprocess.run(["xkbcomp", "-w", "0", "-xkb", display, "-"], capture_output=True, text=True,
                             timeout=30)
        keymap = _SERVER_ACTIONS.sub("action= NoAction();", got.stdout)
        put = None if got.returncode else subprocess.run(["xkbcomp", "-w", "0", "-", display], input=keymap,
                                                          capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GuiError(f"cannot disarm the display's server keys (xkbcomp, from x11-xkb-utils): {exc}") from None
    failed = got if got.returncode else put
    if failed is not None and failed.returncode:
        raise GuiError(f"cannot disarm the display's server keys: xkbcomp exited {failed.returncode}: "
                       f"{failed.stderr.strip()[-200:]}")


def start_chromium(display: str, url: str, *, mode: str, width: int, height: int) -> subprocess.Popen:
    chromium = find_chromium()
    if chromium is None:
        raise GuiError("chromium is not installed (apt-get install chromium)")
    profile = tempfile.mkdtemp(prefix="forge-chromium-")
    where = ["--kiosk", url] if mode == "kiosk" else [f"--app={url}"]
    return subprocess.Popen(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--window-position=0,0",
         f"--window-size={width},{height}", *where],
        env={**os.environ, "DISPLAY": display}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def start_desktop(script: str, display: str, timeout: float = START_TIMEOUT_S) -> None:
    """Run a desktop task's start script on `display` and wait until a window shows, both within `timeout`.
    Its output goes to a file, not a pipe: an application it leaves running in the background keeps its
    output open."""
    deadline = time.monotonic() + timeout
    with tempfile.TemporaryFile() as out:
        try:
            done = subprocess.run(["/bin/sh", "-c", script], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                  env={**os.environ, "DISPLAY": display}, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise GuiError(f"the desktop's start script ran past {timeout:g}s") from None
        if done.returncode:
            out.seek(0)
            said = out.read().decode(errors="replace").strip().splitlines()
            raise GuiError(f"the desktop's start script exited {done.returncode}: {said[-1][-300:] if said else ''}")
    wait_painted(max(1.0, float(round(deadline - time.monotonic()))), display, blank={(0, 0, 0)},
                 what="no application window appeared on the desktop")


def finish_desktop(script: str, display: str, running: list[subprocess.Popen],
                   timeout: float = FINISH_TIMEOUT_S) -> str | None:
    """Run a desktop task's finish script on `display` (the launcher's environment: nothing CMD set reaches
    it); None, or what went wrong in one line. `running` holds it while it runs, for the TERM handler."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(["/bin/sh", "-c", script], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                env={**os.environ, "DISPLAY": display})
        running.append(proc)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _end(proc)
            return f"the desktop's finish script ran past {timeout:g}s"
        if code == 0:
            return None
        out.seek(0)
        said = out.read().decode(errors="replace").strip().splitlines()
        return f"the desktop's finish script exited {code}: {said[-1][-300:] if said else ''}"


def _end(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run(argv: list[str]) -> int:
    sep = argv.index("--") if "--" in argv else len(argv)
    opts, command = argv[:sep], argv[sep + 1:]
    width, height = DEFAULT_SIZE
    url, mode, start, finish, budget = None, "kiosk", None, None, None
    i = 0
    while i < len(opts):
        name, value = opts[i], opts[i + 1] if i + 1 < len(opts) else ""
        if name == "--size":
            width, height = (int(v) for v in value.lower().split("x"))
        elif name in ("--kiosk", "--app"):
            url, mode = value, name[2:]
        elif name == "--start":
            start = value
        elif name == "--finish":
            finish = value
        elif name == "--budget":
            budget = float(value)
        else:
            raise GuiError(f"unknown option {name}")
        i += 2
    xvfb = browser = None
    try:
        xvfb, display = start_xvfb(width, height)
        os.environ["DISPLAY"] = display
        if url:
            browser = start_chromium(display, url, mode=mode, width=width, height=height)
            wait_painted(START_TIMEOUT_S, display)
        if start:
            start_desktop(start, display)
        if not command:
            return 0
        child = subprocess.Popen(command)
        running, stopped = [child], []

        def stop(*_: object) -> None:  # the sandbox ends an exec with SIGTERM/SIGKILL to the whole tree
            stopped.append(True)
            for proc in running:
                if proc.poll() is None:
                    proc.terminate()

        signal.signal(signal.SIGTERM, stop)
        started = time.monotonic()
        try:
            code = child.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            code = None
        # By the launcher's clock as it saw the command end: a launcher the agent held stopped (SIGSTOP) past
        # the budget while the command ran on still reports the overrun.
        if budget is not None and (code is None or time.monotonic() - started > budget):
            _end(child)
            print(f"gui.py run: the command ran past its budget of {budget:g}s and was ended", file=sys.stderr)
            return HARNESS_TIMED_OUT
        # A timed-out or killed harness gets no save step: its rollout ends as it would without one.
        if finish and code >= 0 and not stopped:
            said = finish_desktop(finish, display, running)
            if said:  # the agent's outcome (the window it closed): the file is what it is, never a reward
                print(f"gui.py run: {said}", file=sys.stderr)
        return code
    finally:
        _end(browser)
        _end(xvfb)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    verb, rest = argv[0], argv[1:]
    try:
        if verb == "run":
            return run(rest)
        if verb == "screenshot":
            screenshot().save(rest[0], format="PNG")
        elif verb == "click":
            click(int(rest[0]), int(rest[1]))
        elif verb == "type":
            type_text(rest[0])
        elif verb == "key":
            key(rest[0])
        elif verb == "wait-painted":
            wait_painted()
        elif verb == "wait-colour":
            wait_colour(int(rest[0]), int(rest[1]), tuple(int(v) for v in rest[2].split(",")))  # type: ignore[arg-type]
        else:
            print(f"gui.py: unknown command {verb!r}", file=sys.stderr)
            return 2
    except (GuiError, IndexError, ValueError) as exc:
        print(f"gui.py {verb}: {exc}", file=sys.stderr)
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
