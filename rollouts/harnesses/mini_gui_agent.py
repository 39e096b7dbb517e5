"""The `mini-gui` agent: a compact computer-use loop (screenshot -> one model call -> one action), run
inside a sandbox that has an X display.

Standalone (stdlib + Pillow, plus the `xdotool` program, and agent_files.py beside it): the mini-gui
harness copies this file into the sandbox and runs it as

    python3 mini_gui_agent.py --instruction-file .forge/instruction.txt --max-steps 8 --max-tokens 64

with DISPLAY, OPENAI_BASE_URL, OPENAI_API_KEY and FORGE_MODEL set. Each step:

1. grab the whole screen of $DISPLAY (Pillow's ImageGrab over XCB), downscale it so its longer side is
   at most --max-side pixels (never upscaled), and encode it as PNG;
2. one Chat Completions call: a system message (the action format), then one user message holding the
   instruction, the last --history actions with their results, and the screenshot as an `image_url`
   data URL. Only the current screenshot is sent: a call's size does not grow with the episode;
3. read ONE action from the reply: the first tool call (tools `click`, `type`, `key`, `scroll`,
   `done`), else a JSON object in the text (`{"action": "click", "x": 10, "y": 20}`), else a call
   written as text (`click(10, 20)`, `done("red")`);
4. execute it with xdotool in $DISPLAY, then wait until the screen has not changed for 0.5 s (at most --settle s).

Coordinates are pixels of the screenshot the model saw (w x h, origin top left). A point (x, y) maps
to the screen's (W x H) pixel floor((x + 0.5) * W / w), floor((y + 0.5) * H / h): the centre of the
model's pixel, exact when there is no downscaling. With --grid RxC the image is cut into R rows and C
columns of numbered cells (drawn on the screenshot, numbered from 0 in reading order) and `click`
takes a cell number instead (the cell's centre is clicked): a small action space a tiny model can learn.

Who is to blame: a reply that holds no valid action (garbage, a wrong argument, a point off the
screen) is the policy's doing: it is reported back in the history as an error and costs a step. An
API error, a missing display or xdotool, or an action xdotool cannot run is the harness's: the loop
ends with a non-zero exit. The result is written to .forge/mini_gui_result.json:
`{"status": "done" | "step_limit" | "api_error" | "env_error" | "internal_error", "answer", "steps", "error"}`
and, on `done`, the answer to .forge/answer.txt. Exit codes: 0 done or step limit, 3 the API failed,
4 the environment is unusable (no display, no Pillow, no xdotool), 5 an agent bug.
"""

from __future__ import annotations

import argparse
import ast
import base64
import io
import json
import math
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:  # in the sandbox: the harness put agent_files.py beside this script
    from agent_files import ANSWER_FILE, write_afresh
except ImportError:  # imported from the package (tests, warm-up)
    from openforge.rollouts.harnesses.agent_files import ANSWER_FILE, write_afresh

RESULT_FILE = ".forge/mini_gui_result.json"
ACTIONS = ("click", "type", "key", "scroll", "done")
MAX_TYPE_CHARS = 2000
# A key is a keysym name or one digit (never a number: xdotool reads `0xfed5` as a raw keysym and `200` as
# a keycode); at most MAX_COMBO_KEYS of them joined by '+' (xdotool 3 overruns its key list from 10 keys:
# an X error at 10, a heap corruption at 16, either a harness failure).
KEY_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*|[0-9]")
MAX_COMBO_KEYS = 8
# Keysyms whose XKB actions act on the X server itself (Terminate_Server ended Xvfb). sandbox/gui.py
# also disarms them in the display; refusing them here keeps a display that did not (an older image) alive.
SERVER_KEYS = re.compile(r"Terminate_Server|XF86_?(Switch_VT_\d+|Ungrab|ClearGrab|Next_VMode|Prev_VMode|"
                         r"LogWindowTree|LogGrabInfo)|\w*_Virtual_Screen")
CONNECT_TRIES = 10  # X connections, 0.2 s apart
SETTLE_QUIET_S = 0.5  # after an action, the screen unchanged this long counts as settled
RETRY_STATUSES = (429, 500, 502, 503, 504, 529)  # the proxy's retryable refusals (it sends Retry-After)


class EnvError(Exception):
    """The sandbox cannot run the agent (no display, no xdotool): the harness's failure."""


class XdotoolFailed(EnvError):
    """xdotool ran and exited non-zero."""


class APIFailure(Exception):
    """The model API failed the call: the harness's failure."""


class BadAction(ValueError):
    """The reply holds no valid action: the policy's doing, reported back to it."""


@dataclass(frozen=True)
class Action:
    name: str
    args: tuple[Any, ...]

    def __str__(self) -> str:
        return f"{self.name}({', '.join(json.dumps(a) if isinstance(a, str) else str(a) for a in self.args)})"


# -- the action format ------------------------------------------------------------------------------

def tools(grid: tuple[int, int] | None) -> list[dict[str, Any]]:
    def fn(name: str, desc: str, props: dict[str, Any]) -> dict[str, Any]:
        return {"type": "function", "function": {"name": name, "description": desc, "parameters": {
            "type": "object", "properties": props, "required": list(props)}}}
    click = (fn("click", "Click the centre of a numbered grid cell.", {"cell": {"type": "integer"}}) if grid else
             fn("click", "Left-click a point of the screenshot (pixels, origin top left).",
                {"x": {"type": "integer"}, "y": {"type": "integer"}}))
    return [click,
            fn("type", "Type text at the keyboard focus.", {"text": {"type": "string"}}),
            fn("key", "Press a key or combination, e.g. Return, Tab, ctrl+a.", {"combo": {"type": "string"}}),
            fn("scroll", "Scroll by dy wheel notches (positive: down).", {"dy": {"type": "integer"}}),
            fn("done", "Finish the task with the final answer (empty if none is asked for).",
               {"answer": {"type": "string"}})]


def system_prompt(grid: tuple[int, int] | None) -> str:
    click = (f"click(cell): click the centre of grid cell `cell` (the screenshot is cut into {grid[0]} rows x "
             f"{grid[1]} columns, numbered from 0 left to right, top to bottom)" if grid else
             "click(x, y): left-click pixel (x, y) of the screenshot (origin top left)")
    return ("You operate a computer from screenshots. Each turn you get the task, your previous actions and "
            "the current screenshot, and you reply with exactly ONE action:\n"
            f"- {click}\n- type(text): type text\n- key(combo): press keys, e.g. Return, Tab, ctrl+a\n"
            "- scroll(dy): scroll dy notches, positive is down\n"
            "- done(answer): finish, with the final answer if the task asks for one\n"
            "Call the tool of that name, or write the action as JSON, e.g. "
            '{"action": "click", "x": 10, "y": 20} or {"action": "done", "answer": "..."}, '
            "or plainly as click(10, 20).")


def _int(value: Any, what: str) -> int:
    # NaN and Infinity are JSON to Python's json module, and 1e999 is a float literal: int() of them raised
    # ValueError/OverflowError past the BadAction handler, and the policy's reply became an agent crash.
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or (isinstance(value, float) and not math.isfinite(value)) or value != int(value)):
        raise BadAction(f"{what} must be an integer, got {value!r}")
    return int(value)


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise BadAction(f"{what} must be a string, got {value!r}")
    # A NUL cannot be an argument of xdotool (ValueError) and a lone surrogate cannot be encoded at all
    # (the answer file, xdotool's argv): both crashed the agent, a harness failure instead of a 0.
    if "\0" in value or not value.isascii() and _has_lone_surrogate(value):
        raise BadAction(f"{what} holds a NUL or a lone UTF-16 surrogate: not text")
    return value


def _has_lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _key_combo(combo: str) -> str:
    keys = combo.split("+")
    if not all(KEY_NAME.fullmatch(k) for k in keys):
        raise BadAction(f"key: {combo!r} is not a key combination like Return or ctrl+a")
    if len(keys) > MAX_COMBO_KEYS:
        raise BadAction(f"key: at most {MAX_COMBO_KEYS} keys at once, got {len(keys)}")
    if any(SERVER_KEYS.fullmatch(k) for k in keys):
        raise BadAction(f"key: {combo!r} is an X server control key, not a key of the page")
    return combo


def make_action(name: str, args: dict[str, Any] | list[Any], grid: tuple[int, int] | None) -> Action:
    """An Action from a name and its arguments (by name or by position). BadAction if invalid."""
    if name not in ACTIONS:
        raise BadAction(f"unknown action {name!r}; the actions are {', '.join(ACTIONS)}")
    params = {"click": ("cell",) if grid else ("x", "y"), "type": ("text",), "key": ("combo",),
              "scroll": ("dy",), "done": ("answer",)}[name]
    if isinstance(args, list):
        if name == "done" and not args:
            args = [""]
        if len(args) != len(params):
            raise BadAction(f"{name} takes {len(params)} argument(s) ({', '.join(params)}), got {len(args)}")
        values = list(args)
    else:
        if name == "done" and "answer" not in args:
            args = {**args, "answer": ""}
        missing = [p for p in params if p not in args]
        if missing:
            raise BadAction(f"{name} needs {', '.join(missing)}")
        values = [args[p] for p in params]
    if name in ("click", "scroll"):
        return Action(name, tuple(_int(v, p) for v, p in zip(values, params)))
    text = _str(values[0], params[0])
    if name == "type" and len(text) > MAX_TYPE_CHARS:
        raise BadAction(f"type: at most {MAX_TYPE_CHARS} characters at once")
    if name == "key":
        _key_combo(text)
    return Action(name, (text,))


def _json_objects(text: str) -> list[Any]:
    decoder = json.JSONDecoder()
    found = []
    for i, ch in enumerate(text):
        if ch == "{":
            try:
                obj, _ = decoder.raw_decode(text, i)
            except ValueError:
                continue
            found.append(obj)
    return found


_CALL = re.compile(r"\b(" + "|".join(ACTIONS) + r")\s*\((.*)\)", re.DOTALL)


def parse_text_action(text: str, grid: tuple[int, int] | None) -> Action:
    """The action a reply without tool calls writes: a JSON object, else `name(args)`."""
    for obj in _json_objects(text):
        if isinstance(obj, dict):
            name = obj.get("action", obj.get("name"))
            if isinstance(name, str):
                args = obj.get("arguments", obj.get("args"))
                if isinstance(args, str):  # {"name": ..., "arguments": "<json>"} as the tool-call shape writes it
                    try:
                        args = json.loads(args)
                    except ValueError:
                        raise BadAction(f"{name}: its arguments are not JSON") from None
                if not isinstance(args, (dict, list)):
                    args = {k: v for k, v in obj.items() if k not in ("action", "name")}
                return make_action(name, args, grid)
    match = _CALL.search(text)
    if match is None:
        raise BadAction("the reply holds no action: call a tool, or write e.g. "
                        '{"action": "done", "answer": "..."} or click(10, 20)')
    name, raw = match.group(1), match.group(2).strip()
    try:
        parsed = ast.literal_eval(f"({raw},)") if raw else ()
        args = list(parsed)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        if name not in ("type", "key", "done"):
            raise BadAction(f"{name}: cannot read the arguments {raw[:80]!r}") from None
        args = [raw]  # done(red): an unquoted single string
    return make_action(name, args, grid)


def parse_reply(message: dict[str, Any], grid: tuple[int, int] | None) -> Action:
    """ONE action from an assistant message: its first tool call, else its text."""
    calls = message.get("tool_calls") or []
    if calls:
        fn = (calls[0] or {}).get("function") or {}
        name = fn.get("name")
        if not isinstance(name, str):
            raise BadAction("a tool call without a name")
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            raise BadAction(f"{name}: its arguments are not JSON") from None
        if not isinstance(args, dict):
            raise BadAction(f"{name}: its arguments must be a JSON object")
        return make_action(name, args, grid)
    content = message.get("content")
    if isinstance(content, list):  # content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return parse_text_action(content if isinstance(content, str) else "", grid)


# -- the screen ------------------------------------------------------------------------------------

@dataclass
class Screen:
    """The display: its screenshots and where the model's coordinates land on it."""

    display: str
    max_side: int
    grid: tuple[int, int] | None
    size: tuple[int, int] = (0, 0)  # the screen's W x H
    shown: tuple[int, int] = (0, 0)  # the screenshot's w x h, as the model saw it

    def grab(self) -> Any:
        from PIL import ImageGrab
        for attempt in range(CONNECT_TRIES):
            try:
                return ImageGrab.grab(xdisplay=self.display)
            except OSError as exc:  # an X server started without -noreset refuses connections while it resets
                if attempt + 1 == CONNECT_TRIES:
                    raise EnvError(f"cannot take a screenshot of display {self.display!r}: {exc}") from None
                time.sleep(0.2)
        raise AssertionError("unreachable")

    def screenshot_png(self) -> bytes:
        """The current screen as the model sees it (downscaled, with the grid in grid mode)."""
        from PIL import Image, ImageDraw
        image = self.grab().convert("RGB")
        self.size = image.size
        scale = min(1.0, self.max_side / max(image.size))
        if scale < 1.0:
            image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))),
                                 Image.Resampling.LANCZOS)
        self.shown = image.size
        if self.grid:
            draw = ImageDraw.Draw(image)
            for i, (x0, y0, x1, y1) in enumerate(self.cells()):
                draw.rectangle((x0, y0, x1 - 1, y1 - 1), outline=(255, 0, 255))
                draw.text((x0 + 2, y0 + 1), str(i), fill=(255, 0, 255))
        out = io.BytesIO()
        image.save(out, format="PNG", optimize=False)
        return out.getvalue()

    def cells(self) -> list[tuple[int, int, int, int]]:
        """Grid cells in the screenshot's pixels, reading order: (x0, y0, x1, y1), x1/y1 exclusive."""
        assert self.grid
        rows, cols = self.grid
        w, h = self.shown
        return [(c * w // cols, r * h // rows, (c + 1) * w // cols, (r + 1) * h // rows)
                for r in range(rows) for c in range(cols)]

    def to_screen(self, x: int, y: int) -> tuple[int, int]:
        """The screen pixel under the screenshot's pixel (x, y): the centre of that pixel, scaled."""
        w, h = self.shown
        if not (0 <= x < w and 0 <= y < h):
            raise BadAction(f"click({x}, {y}) is off the screenshot, which is {w}x{h}")
        width, height = self.size
        return min(width - 1, int((x + 0.5) * width / w)), min(height - 1, int((y + 0.5) * height / h))

    def cell_point(self, cell: int) -> tuple[int, int]:
        cells = self.cells()
        if not 0 <= cell < len(cells):
            raise BadAction(f"there is no cell {cell}; the cells are 0..{len(cells) - 1}")
        x0, y0, x1, y1 = cells[cell]
        return self.to_screen((x0 + x1 - 1) // 2, (y0 + y1 - 1) // 2)

    def settle(self, limit_s: float) -> None:
        """Wait until the screen has not changed for SETTLE_QUIET_S (a page reacting to the action), at
        most limit_s. Two equal screenshots 0.1 s apart were not enough: a click's form post had not yet
        repainted the page, so the model saw the old screen and clicked again."""
        deadline = time.monotonic() + limit_s
        last, changed = self.grab().tobytes(), time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = self.grab().tobytes()
            if now != last:
                last, changed = now, time.monotonic()
            elif time.monotonic() - changed >= SETTLE_QUIET_S:
                return


def xdotool(display: str, *args: str) -> None:
    for attempt in range(CONNECT_TRIES):
        try:
            done = subprocess.run(["xdotool", *args], env={**os.environ, "DISPLAY": display}, capture_output=True,
                                  text=True, timeout=30, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise EnvError("xdotool is not installed in the sandbox (apt-get install xdotool)") from None
        except subprocess.TimeoutExpired:
            raise EnvError(f"xdotool {args[0]} did not finish in 30 s") from None
        # It could not connect (a resetting server): nothing was done, so trying again repeats nothing.
        if done.returncode == 0 or "Can't open display" not in done.stderr:
            break
        time.sleep(0.2)
    if done.returncode != 0:
        raise XdotoolFailed(f"xdotool {' '.join(args[:2])} failed: {(done.stderr or done.stdout).strip()[-200:]}")


def _pointer(display: str) -> tuple[int, int] | None:
    """Where the pointer is (xdotool getmouselocation), or None when xdotool cannot say."""
    try:
        done = subprocess.run(["xdotool", "getmouselocation", "--shell"], env={**os.environ, "DISPLAY": display},
                              capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    fields = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    try:
        return int(fields["X"]), int(fields["Y"])
    except (KeyError, ValueError):
        return None


def execute(action: Action, screen: Screen) -> str:
    """Run one action in the display; its result line for the history. BadAction: the policy's mistake."""
    d = screen.display
    if action.name == "click":
        x, y = screen.cell_point(action.args[0]) if screen.grid else screen.to_screen(*action.args)
        # `mousemove --sync` to where the pointer already is waits ~15 s for a motion that never comes
        move = [] if _pointer(d) == (x, y) else ["mousemove", "--sync", str(x), str(y)]
        xdotool(d, *move, "click", "1")
        return f"clicked the screen at ({x}, {y})"
    if action.name in ("type", "key"):
        try:
            if action.name == "type":
                xdotool(d, "type", "--delay", "5", "--", action.args[0])
            else:
                xdotool(d, "key", "--", action.args[0])
        except XdotoolFailed as exc:
            # Text and keys are the policy's own: xdotool refusing them while the display still answers
            # is the policy's mistake (reported back), not the harness's (which would drop the group).
            screen.grab()  # EnvError when the display itself is gone
            raise BadAction(f"{action.name}: {exc}") from None
        return f"typed {len(action.args[0])} character(s)" if action.name == "type" else "ok"
    if action.name == "scroll":
        dy = action.args[0]
        notches = min(abs(dy), 20)
        if notches:
            xdotool(d, "click", "--repeat", str(notches), "--delay", "30", "5" if dy > 0 else "4")
        return f"scrolled {notches if dy >= 0 else -notches} notch(es)"
    raise AssertionError(action.name)


# -- the model -------------------------------------------------------------------------------------

def chat(base_url: str, api_key: str, body: dict[str, Any], *, timeout: float, tries: int = 3) -> dict[str, Any]:
    """One Chat Completions call (urllib). Retries the proxy's retryable refusals, honouring Retry-After."""
    data = json.dumps(body).encode("utf-8")
    for attempt in range(tries):
        req = urllib.request.Request(base_url.rstrip("/") + "/chat/completions", data=data, method="POST",
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                reply = json.loads(resp.read())
            break
        except urllib.error.HTTPError as exc:
            text = exc.read().decode("utf-8", "replace")
            if exc.code in RETRY_STATUSES and attempt + 1 < tries:
                time.sleep(min(10.0, float(exc.headers.get("retry-after") or 1)))
                continue
            try:
                text = json.loads(text)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                pass
            raise APIFailure(f"API error {exc.code}: {str(text).strip()[:300]}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            if attempt + 1 < tries and not isinstance(exc, ValueError):
                time.sleep(1.0)
                continue
            raise APIFailure(f"API call failed: {getattr(exc, 'reason', exc)}") from None
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not choices or not isinstance(choices[0].get("message"), dict):
        raise APIFailure("API reply without choices")
    return choices[0]["message"]


def user_message(instruction: str, history: list[str], png: bytes, screen: Screen) -> dict[str, Any]:
    w, h = screen.shown
    lines = [f"Task: {instruction.strip()}", f"Screenshot: {w}x{h} pixels."]
    lines += ["Previous actions:", *history] if history else ["No actions yet."]
    url = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    return {"role": "user", "content": [{"type": "text", "text": "\n".join(lines)},
                                        {"type": "image_url", "image_url": {"url": url}}]}


def agent_loop(instruction: str, screen: Screen, *, model: str, base_url: str, api_key: str, max_steps: int,
               max_tokens: int, history_len: int, use_tools: bool, settle_s: float, call_timeout: float,
               ) -> dict[str, Any]:
    """Run the loop; returns the result record (status, answer, steps, error)."""
    history: list[str] = []
    for step in range(max_steps):
        png = screen.screenshot_png()
        body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "messages": [
            {"role": "system", "content": system_prompt(screen.grid)},
            user_message(instruction, history[-history_len:] if history_len else [], png, screen)]}
        if use_tools:
            body["tools"] = tools(screen.grid)
        try:
            message = chat(base_url, api_key, body, timeout=call_timeout)
        except APIFailure as exc:
            return {"status": "api_error", "answer": None, "steps": step, "error": str(exc)}
        try:
            action = parse_reply(message, screen.grid)
            if action.name == "done":
                print(f"mini-gui: step {step}: {action}")
                return {"status": "done", "answer": action.args[0], "steps": step + 1, "error": None}
            result = execute(action, screen)
        except BadAction as exc:
            print(f"mini-gui: step {step}: invalid action: {exc}")
            history.append(f"{step + 1}. invalid: {exc}")
            continue
        print(f"mini-gui: step {step}: {action} -> {result}")
        history.append(f"{step + 1}. {action} -> {result}")
        screen.settle(settle_s)
    print(f"mini-gui: stopped after {max_steps} steps without done")
    return {"status": "step_limit", "answer": None, "steps": max_steps, "error": None}


def _grid(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)x(\d+)", text)
    if not match or not (1 <= int(match.group(1)) <= 20 and 1 <= int(match.group(2)) <= 20):
        raise argparse.ArgumentTypeError("--grid takes RxC, e.g. 3x3 (1..20 each)")
    return int(match.group(1)), int(match.group(2))


EXIT_CODES = {"done": 0, "step_limit": 0, "api_error": 3, "env_error": 4, "internal_error": 5}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--instruction-file", required=True)
    p.add_argument("--max-steps", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-side", type=int, default=1024, help="the screenshot's longer side at most (pixels)")
    p.add_argument("--grid", type=_grid, default=None, help="RxC: click numbered grid cells instead of points")
    p.add_argument("--history", type=int, default=5, help="previous actions shown to the model")
    p.add_argument("--no-tools", dest="tools", action="store_false", help="send no tools: JSON/text actions only")
    p.add_argument("--settle", type=float, default=2.0, help="wait at most this long for the screen to settle")
    args = p.parse_args(argv)
    for stream in (sys.stdout, sys.stderr):  # the log quotes the policy's text: never an encoding crash
        stream.reconfigure(errors="backslashreplace")  # type: ignore[attr-defined]
    instruction = Path(args.instruction_file).read_text(encoding="utf-8")
    record: dict[str, Any] = {"status": "internal_error", "answer": None, "steps": 0, "error": "did not run"}
    try:
        display = os.environ.get("DISPLAY", "")
        if not display:
            raise EnvError("no DISPLAY: the sandbox has no X display (a browser sandbox sets one)")
        try:
            import PIL  # noqa: F401
        except ImportError:
            raise EnvError(f"the python at {sys.executable} has no Pillow (apt-get install python3-pil)") from None
        screen = Screen(display, max(16, args.max_side), args.grid)
        record = agent_loop(instruction, screen, model=os.environ.get("FORGE_MODEL", "forge-policy"),
                            base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"],
                            max_steps=args.max_steps, max_tokens=args.max_tokens, history_len=args.history,
                            use_tools=args.tools, settle_s=args.settle,
                            call_timeout=float(os.environ.get("FORGE_CALL_TIMEOUT", "300")))
    except EnvError as exc:
        record = {"status": "env_error", "answer": None, "steps": record.get("steps", 0), "error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - an agent bug must still leave a result and an exit code
        record = {"status": "internal_error", "answer": None, "steps": 0, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        write_afresh(RESULT_FILE, json.dumps(record))
        if record["status"] == "done":
            write_afresh(ANSWER_FILE, record["answer"])
    if record["error"]:
        print(f"mini-gui: {record['status']}: {record['error']}", file=sys.stderr)
    return EXIT_CODES[record["status"]]


if __name__ == "__main__":
    sys.exit(main())
