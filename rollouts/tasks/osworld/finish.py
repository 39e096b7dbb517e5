"""OSWorld's save step after the agent: a postconfig that drives the application, as a desktop task's finish script.

OSWorld's evaluator runs the task's `postconfig` after the agent's last action and before its getters read
the result (desktop_env.py `evaluate`): typically `activate_window` on the document's window, a `python -c
"import pyautogui; pyautogui.hotkey('ctrl', 's')"` and a `sleep`, so that the file the metric reads holds
what the agent left open. forge grades once every agent process, the applications included, has ended;
such a postconfig becomes the desktop's `finish` script instead (rollouts/tasks/desktop/task.py), which gui.py's
launcher runs on the display after the harness exits by itself and before it ends the display:

    activate_window   the first visible window whose title (`by_class`: WM_CLASS) holds `window_name`, any
                      case, as OSWorld's `wmctrl -a` finds it; `strict`: the whole title, same case (`-F`).
                      `xdotool windowactivate --sync`, or `windowfocus --sync` where the display has no
                      window manager to activate with (forge's Xvfb has none)
    close_window      the same window, as OSWorld's `wmctrl -c` finds it, closed as a window manager closes
                      it: WM_DELETE_WINDOW where the application takes it (it quits as by its close button,
                      saving what it saves on quit), else XKillClient (CLOSE_PY)
    execute, command  `python -c` of pyautogui `hotkey`, `press`, `typewrite` / `write` of plain text and
                      `time.sleep` only: `xdotool key` / `xdotool type`; any other shell line as it is
    sleep             sleep

Anything else (a click, a class given as instance.class but not strict) is refused with its reason. As in
OSWorld a step that fails (no such window) does not stop the next: the keys go where the focus is, and the
file is what it is.

The same mapping runs such steps in a task's `config` after its launch / open step (osworld/importer.py): they are
lines of the desktop's start script (`start_lines`), where a window step first waits for its window.
"""

from __future__ import annotations

import ast
import re
import shlex
from typing import Any

# pyautogui's key names (pyautogui/_pyautogui_x11.py) -> X keysyms, for the keys OSWorld's postconfigs press
_KEYSYMS = {"enter": "Return", "return": "Return", "\n": "Return", "esc": "Escape", "escape": "Escape",
            "tab": "Tab", "\t": "Tab", "space": "space", " ": "space", "backspace": "BackSpace",
            "delete": "Delete", "del": "Delete", "insert": "Insert", "home": "Home", "end": "End",
            "pageup": "Prior", "pgup": "Prior", "pagedown": "Next", "pgdn": "Next", "up": "Up", "down": "Down",
            "left": "Left", "right": "Right", "ctrl": "Control_L", "ctrlleft": "Control_L",
            "ctrlright": "Control_R", "shift": "Shift_L", "shiftleft": "Shift_L", "shiftright": "Shift_R",
            "alt": "Alt_L", "altleft": "Alt_L", "altright": "Alt_R", "win": "Super_L", "winleft": "Super_L",
            "winright": "Super_R", **{f"f{i}": f"F{i}" for i in range(1, 13)}}
_PLAIN_KEY = re.compile(r"^[a-z0-9]$")
_TEXT = re.compile(r"^[ -~]{1,200}$")  # printable ASCII: xdotool types it as written
# forge_find FLAG PATTERN [TITLE] [CLASS]: the first visible window FLAG (--name, --class, --classname) matches,
# whose title is TITLE and whose WM_CLASS class matches CLASS where given; $forge_wait: seconds to wait
# for one (the start script's: the application it just launched has yet to map its window; OSWorld's VM is slow
# enough between its steps, forge's script is not). xdotool's patterns ignore case. forge_window focuses it.
# forge_close: the same search, then the window closed as OSWorld's `wmctrl -c` has its window manager close it
# (ICCCM, what mutter does for _NET_CLOSE_WINDOW): a WM_DELETE_WINDOW message where the window's WM_PROTOCOLS
# takes one (the application quits as on its title bar's close button: Thunderbird writes its prefs), else
# XKillClient. There is no window manager here to ask, and this xdotool (3.20160805) has no graceful close, so
# CLOSE_PY sends it through libX11 with ctypes (stdlib; libX11 is there wherever xdotool is).
PRELUDE = r"""forge_find() {
  forge_until=$(( $(date +%s) + ${forge_wait:-0} ))
  while :; do
    for w in $(xdotool search --onlyvisible "$1" "$2" 2>/dev/null); do
      [ -z "$3" ] || [ "$(xdotool getwindowname "$w")" = "$3" ] || continue
      [ -z "$4" ] || xdotool search --onlyvisible --class "$4" 2>/dev/null | grep -qx "$w" || continue
      echo "$w"; return
    done
    [ "$(date +%s)" -lt "$forge_until" ] || break
    sleep 0.5
  done
  echo "no window matches $2${4:+ (class $4)}" >&2; return 1
}
forge_window() {
  w=$(forge_find "$@") || return 1
  xdotool windowactivate --sync "$w" 2>/dev/null || xdotool windowfocus --sync "$w"
}
forge_close() {
  w=$(forge_find "$@") || return 1
  "${FORGE_PYTHON:-python3}" -I -c "$forge_close_py" "$w"
}
forge_status=0"""
CLOSE_PY = """import ctypes as c, sys
x = c.CDLL("libX11.so.6")
x.XOpenDisplay.restype = c.c_void_p
x.XInternAtom.restype, x.XInternAtom.argtypes = c.c_ulong, [c.c_void_p, c.c_char_p, c.c_int]
x.XGetWMProtocols.argtypes = [c.c_void_p, c.c_ulong, c.POINTER(c.POINTER(c.c_ulong)), c.POINTER(c.c_int)]
x.XSendEvent.argtypes = [c.c_void_p, c.c_ulong, c.c_int, c.c_long, c.c_void_p]
x.XKillClient.argtypes = [c.c_void_p, c.c_ulong]
x.XCloseDisplay.argtypes = [c.c_void_p]
class Message(c.Structure):  # XClientMessageEvent
    _fields_ = [("type", c.c_int), ("serial", c.c_ulong), ("send_event", c.c_int), ("display", c.c_void_p),
                ("window", c.c_ulong), ("message_type", c.c_ulong), ("format", c.c_int), ("data", c.c_long * 5)]
class Event(c.Union):  # XEvent: 24 longs
    _fields_ = [("xclient", Message), ("pad", c.c_long * 24)]
d, w = x.XOpenDisplay(None), int(sys.argv[1])
if not d:
    sys.exit("cannot open the display")
delete, atoms, n = x.XInternAtom(d, b"WM_DELETE_WINDOW", 0), c.POINTER(c.c_ulong)(), c.c_int()
if x.XGetWMProtocols(d, w, c.byref(atoms), c.byref(n)) and delete in atoms[:n.value]:
    e = Event()
    e.xclient.type, e.xclient.window, e.xclient.format = 33, w, 32  # ClientMessage
    e.xclient.message_type = x.XInternAtom(d, b"WM_PROTOCOLS", 0)
    e.xclient.data[0] = delete  # data[1]: the time, CurrentTime (0)
    x.XSendEvent(d, w, 0, 0, c.byref(e))
else:
    x.XKillClient(d, w)
x.XCloseDisplay(d)
"""
assert "'" not in CLOSE_PY  # it rides in the script single-quoted
PRELUDE += f"\nforge_close_py='{CLOSE_PY}'"
START_WAIT_S = 20  # how long a start script's activate_window waits for the window its launch opens


GUI_POSTCONFIG = ("activate_window", "close_window")  # steps that exist only to act on a window


class NotMapped(ValueError):
    """A postconfig step forge cannot run after the agent (the reason)."""


def drives_gui(step: Any) -> bool:
    """Whether OSWorld's postconfig step acts on the display (so it needs the desktop's finish script)."""
    if not isinstance(step, dict):
        return False
    if step.get("type") in GUI_POSTCONFIG:
        return True
    text = str((step.get("parameters") or {}).get("command", ""))
    return step.get("type") in ("execute", "command") and any(w in text for w in ("pyautogui", "xdotool", "wmctrl"))


def _keysym(name: Any) -> str:
    if not isinstance(name, str):
        raise NotMapped(f"pyautogui key {name!r:.40} is not a key name")
    low = name.lower() if len(name) > 1 else name
    if low in _KEYSYMS:
        return _KEYSYMS[low]
    if _PLAIN_KEY.match(low):
        return low
    raise NotMapped(f"pyautogui key {name!r:.40} is not mapped to an X key")


def _constants(call: ast.Call) -> list[Any]:
    if call.keywords:
        raise NotMapped(f"pyautogui call with {call.keywords[0].arg}= is not mapped")
    try:
        return [ast.literal_eval(a) for a in call.args]
    except ValueError:
        raise NotMapped("a pyautogui call with a computed argument is not mapped") from None


def _call_line(call: ast.Call) -> str:
    func = call.func
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)):
        raise NotMapped("the pyautogui script calls something other than pyautogui.* or time.sleep")
    where, name, args = func.value.id, func.attr, _constants(call)
    if (where, name) == ("time", "sleep") and len(args) == 1 and isinstance(args[0], (int, float)):
        return f"sleep {float(args[0]):g}"
    if where != "pyautogui":
        raise NotMapped(f"{where}.{name} is not mapped")
    if name == "hotkey":
        keys = args[0] if len(args) == 1 and isinstance(args[0], list) else args
        if not keys:
            raise NotMapped("pyautogui.hotkey with no key")
        return "xdotool key " + shlex.quote("+".join(_keysym(k) for k in keys))
    if name == "press" and len(args) == 1:
        keys = args[0] if isinstance(args[0], list) else [args[0]]
        return "xdotool key " + " ".join(shlex.quote(_keysym(k)) for k in keys)
    if name in ("write", "typewrite") and len(args) == 1:
        if isinstance(args[0], list):
            return "xdotool key " + " ".join(shlex.quote(_keysym(k)) for k in args[0])
        if isinstance(args[0], str) and _TEXT.match(args[0]):
            return "xdotool type -- " + shlex.quote(args[0])
        raise NotMapped("pyautogui.write of other than plain printable text is not mapped")
    raise NotMapped(f"pyautogui.{name} is not mapped (hotkey, press, write, typewrite and time.sleep are)")


def pyautogui_lines(code: str) -> list[str]:
    """A `python -c` pyautogui script's steps as xdotool lines, or NotMapped."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        raise NotMapped("the pyautogui script does not parse") from None
    lines = []
    for node in tree.body:
        if isinstance(node, ast.Import) and all(a.name in ("pyautogui", "time") and not a.asname for a in node.names):
            continue
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
            raise NotMapped("the pyautogui script does more than call pyautogui.* and time.sleep")
        lines.append(_call_line(node.value))
    return lines


def _window_line(kind: str, params: dict[str, Any]) -> str:
    """activate_window / close_window as a forge_window / forge_close line: the window OSWorld's `wmctrl -a` /
    `wmctrl -c` (`-x`: by_class, `-F`: strict) would act on."""
    name, function = params.get("window_name"), "forge_close" if kind == "close_window" else "forge_window"
    if not isinstance(name, str) or not name or not _TEXT.match(name):
        raise NotMapped(f"{kind}: window_name {name!r:.60} (plain text)")
    by_class, strict = bool(params.get("by_class", False)), bool(params.get("strict", False))
    if by_class and "." in name:
        # wmctrl -x matches "instance.class" (WM_CLASS's two strings); xdotool searches each apart: the
        # windows whose instance (--classname) is the first part and whose class (--class) is the second
        instance, _, klass = name.partition(".")
        if not strict or not instance or not klass or "." in klass:
            raise NotMapped(f"{kind} by_class on instance.class {name!r} is mapped only strict "
                            "(one instance, one class)")
        return f"{function} --classname {shlex.quote(_regex(instance, True))} '' {shlex.quote(_regex(klass, True))}"
    pattern = _regex(name, strict)
    exact = shlex.quote(name) if strict and not by_class else ""
    return f"{function} {'--class' if by_class else '--name'} {shlex.quote(pattern)} {exact}".rstrip()


def _regex(text: str, whole: bool) -> str:
    """A POSIX extended regex (xdotool's) matching `text` in a name, or (`whole`) the whole name."""
    pattern = re.sub(r"([.\[\]()*+?{}|^$\\])", r"\\\1", text)
    return f"^{pattern}$" if whole else pattern


def finish_line(step: dict[str, Any], shell_line: str | None) -> list[str]:
    """One GUI postconfig step as finish-script lines; `shell_line`: the step's command as osworld/importer.py's shell
    line (an execute step), whose pyautogui script is mapped and any other line is kept as it is."""
    kind, params = step.get("type"), step.get("parameters") or {}
    if kind in GUI_POSTCONFIG:
        return [_window_line(kind, params)]
    if shell_line is None:
        raise NotMapped(f"postconfig step {kind} is not mapped")
    command = params.get("command")
    args = shlex.split(command) if isinstance(command, str) else command
    if isinstance(args, list) and len(args) == 3 and args[0] in ("python", "python3") and args[1] == "-c" \
            and "pyautogui" in args[2]:
        return pyautogui_lines(args[2])
    if any(w in shell_line for w in ("pyautogui", "xdotool", "wmctrl")):
        raise NotMapped("a postconfig command drives the GUI other than with a `python -c` pyautogui script")
    return [shell_line]


def finish_script(lines: list[str]) -> str:
    """The finish script: every step runs, as OSWorld's do; it exits with the last failure's code, so the
    launcher can say what failed (no such window) in the rollout's stderr."""
    steps = [f"(\n{line}\n) || forge_status=$?" for line in lines]  # a subshell each: OSWorld's are processes
    return "\n".join([PRELUDE, 'export OSW_HOME="$PWD"', *steps, 'exit "$forge_status"'])


def start_lines(step: dict[str, Any], shell_line: str | None) -> list[str]:
    """A config step after the launch that drives the display, as lines of the desktop's start script
    (mapped as finish_line maps it; NotMapped likewise). The script stops at a failing line (`set -e`); as in
    OSWorld a step that fails does not stop the next. The script starts with START_PRELUDE."""
    return [f"{line} || true" for line in finish_line(step, shell_line)]


# a window step in the start script waits for the window the launch before it opens
START_PRELUDE = f"{PRELUDE}\nforge_wait={START_WAIT_S}"
