"""`forge tasks import osworld SRC`: OSWorld-format JSON tasks as forge tasks.

SRC is an OSWorld checkout, its `evaluation_examples/examples/` (one folder per domain of `<id>.json`),
one domain folder, or one task file. Each task's `config` steps become the forge task's setup, its
`evaluator` an `OSWorldEval` graded after the agent is gone (rollouts/tasks/osworld/evaluator.py):

    download          only from a local copy, in OSWorld's own cache layout: CACHE/<task id>/
                      <uuid5(URL)>_<file name> (`--cache`); without one the task is online-only
    execute, command  a shell line (OSWorld's /home/user and ~/ are the sandbox's working directory);
                      one that drives the GUI (pyautogui, xdotool, wmctrl) is unsupported
    sleep             sleep
    launch, open      start the named desktop application (`open`: the file's, as OSWorld's xdg-open would):
                      the task becomes a desktop task (rollouts/tasks/desktop/task.py), this step and every
                      one after it its start script, run on the sandbox's display before the agent
    googledrive, login, chrome_open_tabs, update_browse_history   online-only
    activate_window,  after the launch / open step: start-script lines on the display, mapped as the
    close_window,     finish script's are (rollouts/tasks/osworld/finish.py; a window step waits for its window)
    pyautogui
    anything else     unsupported (activate_window or close_window before a launch, ... before the agent)

A `postconfig` (run after the agent, before the getters) of shell lines runs in the sandbox at grading; one
that saves on the display (activate_window, close_window, pyautogui keys) becomes the desktop's finish script, every step
of it (rollouts/tasks/osworld/finish.py), run on the display after the harness exits by itself.

A task is imported, online-only (it needs the internet: a download or an expected file with no local
copy, a web step) or unsupported (a step, getter or metric forge does not run), each refused one with
its reason; an imported task that starts a desktop application not installed here is counted apart
(`not_here`). Nothing is dropped without a line saying so. The result is OSWorld-format tasks run on
forge, never an OSWorld score.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import ValidationError

from openforge.errors import TaskError
from openforge.rollouts.harnesses.agent_files import ANSWER_FILE
from openforge.rollouts.tasks.grading import check_relative_paths
from openforge.rollouts.tasks.osworld.evaluator import OSWorldEval
from openforge.rollouts.tasks.osworld.finish import (GUI_POSTCONFIG, START_PRELUDE, NotMapped, drives_gui, finish_line,
                                                     finish_script, start_lines)
from openforge.rollouts.tasks.osworld.metric import METRIC_MODULES
from openforge.rollouts.tasks.setup_files import read_task_file

SETUP_DIR = ".forge-osworld"  # the downloads' local copies, decoded to their places by setup and removed
TIME_LIMIT_S = 600.0
ONLINE_STEPS = {"googledrive", "login", "chrome_open_tabs", "chrome_close_tabs", "update_browse_history"}
GUI_WORDS = ("pyautogui", "xdotool", "wmctrl")
# a launched program or an opened file's type -> (the application, the binary that must be on PATH)
APPS = {"libreoffice": ("LibreOffice", "soffice"), "soffice": ("LibreOffice", "soffice"), "gimp": ("GIMP", "gimp"),
        "vlc": ("VLC", "vlc"), "thunderbird": ("Thunderbird", "thunderbird"), "code": ("VS Code", "code"),
        "google-chrome": ("Chromium", "chromium"), "chromium": ("Chromium", "chromium"),
        "nautilus": ("a file manager", "nautilus")}
OPEN_WITH = {**dict.fromkeys((".xlsx", ".xls", ".ods", ".csv", ".docx", ".doc", ".odt", ".pptx", ".ppt", ".odp"),
                             "libreoffice"),
             **dict.fromkeys((".png", ".jpg", ".jpeg", ".xcf"), "gimp"), **dict.fromkeys((".mp4", ".mp3"), "vlc")}
HOME_NOTE = ("\n\n(OSWorld-format task: the task's home folder, /home/user or ~ above, is your current working "
             "directory. If the task cannot be done, answer FAIL.)")
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # forge's task ids; a folder name in the cache
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")  # `VAR=1 app`: an environment prefix, not the program


@dataclass
class OSWorldImport:
    """What an import made: forge task records and each refused task with why (task id, reason)."""

    tasks: list[dict[str, Any]] = field(default_factory=list)
    online_only: list[tuple[str, str]] = field(default_factory=list)
    unsupported: list[tuple[str, str]] = field(default_factory=list)
    not_here: list[tuple[str, str]] = field(default_factory=list)  # imported, but this machine lacks what it needs
    notes: list[tuple[str, str]] = field(default_factory=list)  # imported, a GUI-only setup step skipped


class _Refused(Exception):
    def __init__(self, reason: str, *, online: bool = False) -> None:
        super().__init__(reason)
        self.online = online


def _home_path(path: str) -> str:
    """OSWorld's /home/user/x, ~/x or x (the VM server's folder is the home) as a path relative to the
    working directory."""
    for prefix in ("/home/user/", "~/", ""):
        rel = path[len(prefix):] if path.startswith(prefix) else None
        if rel and not rel.startswith(("/", "~")) and ":" not in rel and "\\" not in rel:
            try:
                check_relative_paths({rel: ""}, "the home folder")
            except ValueError:
                break
            return rel
    raise _Refused(f"path {path!r} is outside /home/user (forge maps only the home folder)")


def _shell(command: Any, shell: bool) -> str:
    """A shell line for OSWorld's command (a list, or a string with shell=True); /home/user and a
    leading ~/ become "$OSW_HOME" (osworld_eval.HOME_PRELUDE sets it)."""
    if isinstance(command, str) and shell:
        line = command.replace("/home/user", "$OSW_HOME").replace("~/", "$OSW_HOME/")
    else:
        args = shlex.split(command) if isinstance(command, str) else command
        if not isinstance(args, list) or not args or not all(isinstance(a, str) for a in args):
            raise _Refused(f"malformed command {command!r}")
        quoted, leading = [], True
        for arg in args:
            arg = "/home/user/" + arg[2:] if arg.startswith("~/") else arg
            # a leading assignment stays one: its name unquoted (a quoted `'VAR=1'` is a command's name)
            name = m.group(0) if leading and (m := _ASSIGNMENT.match(arg)) else ""
            leading, arg = bool(name), arg[len(name):]
            quoted.append(name + ('"$OSW_HOME"'.join(shlex.quote(p) if p else "" for p in arg.split("/home/user"))
                                  or ("" if name else "''")))
        line = " ".join(quoted)
    return line


def _local_copy(cache: Path | None, task_id: str, name: str, url: str) -> bytes:
    if not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in "/\\\0"):  # never a path
        raise _Refused(f"malformed file name {name!r:.80}")
    if cache is not None and (cache / task_id / name).is_file():
        try:  # the loaders' one check: no link out of the task's cache folder, nothing past the size limit
            return read_task_file(cache / task_id / name, cache / task_id)
        except ValueError as exc:
            raise _Refused(str(exc)) from None
    raise _Refused(f"{url} has no local copy ({'no --cache given' if cache is None else f'{cache}/{task_id}/{name}'})",
                   online=True)


def _app(name: str, apps: dict[str, str]) -> str:
    """The application's binary, recorded in `apps` (label -> binary): the desktop checks it is installed."""
    label, binary = APPS.get(PurePosixPath(name).name, (name, PurePosixPath(name).name))
    apps[label] = binary
    return binary


def _step(step: Any, task_id: str, cache: Path | None, files: dict[str, str], apps: dict[str, str],
          notes: list[str] | None = None) -> list[str]:
    """A config step's shell lines. `notes` is given for the steps before the agent: there a command that
    only drives the GUI (OSWorld's click that opens a terminal) is skipped and noted, since a forge agent
    has its shell already; after the agent (postconfig) such a command is unsupported."""
    if not isinstance(step, dict) or not isinstance(step.get("type"), str):
        raise _Refused(f"malformed config step {step!r:.80}")
    kind, params = step["type"], step.get("parameters") or {}
    if kind in ONLINE_STEPS:
        raise _Refused(f"config step {kind} needs the internet", online=True)
    if kind == "sleep":
        return [f"sleep {float(params.get('seconds', 0)):g}"]
    if kind in ("execute", "command"):
        if params.get("until"):
            raise _Refused(f"config step {kind} with `until` (polling the output) is not supported")
        line = _shell(params.get("command"), bool(params.get("shell", False)))
        if any(word in line for word in GUI_WORDS):
            if notes is None or not line.startswith(("python -c 'import pyautogui", "python3 -c 'import pyautogui")):
                raise _Refused("a command drives the GUI (pyautogui, xdotool, wmctrl)")
            notes.append(f"skipped a setup step that only drives the GUI: {line[:100]}")
            return []
        return [line]
    if kind == "download":
        lines = []
        for f in params.get("files") or []:
            dest = _home_path(f["path"])
            name = f"{uuid.uuid5(uuid.NAMESPACE_URL, f['url'])}_{PurePosixPath(f['path']).name}"
            key = f"{SETUP_DIR}/{len(files)}.b64"
            files[key] = base64.b64encode(_local_copy(cache, task_id, name, f["url"])).decode()
            lines.append(f'mkdir -p "$OSW_HOME"/{shlex.quote(str(PurePosixPath(dest).parent))} && base64 -d {key} > '
                         f'"$OSW_HOME"/{shlex.quote(dest)} && rm {key}')
        return lines
    if kind == "launch":
        command = params.get("command")
        args = command.split() if isinstance(command, str) else command
        if not isinstance(args, list):
            raise _Refused(f"launch: malformed command {command!r:.80}")
        program = [a for a in args if not (isinstance(a, str) and _ASSIGNMENT.match(a))]  # `VAR=1 app`: app
        program = program[1:] if program[:1] == ["env"] else program
        if not program:
            raise _Refused("launch: no command")
        _app(program[0], apps)
        return [f"( {_shell(command, bool(params.get('shell', False)))} >/dev/null 2>&1 & )"]
    if kind == "open":
        path = _home_path(params.get("path", ""))
        binary = _app(OPEN_WITH.get(PurePosixPath(path).suffix.lower(), "xdg-open"), apps)
        return [f'( {shlex.quote(binary)} "$OSW_HOME"/{shlex.quote(path)} >/dev/null 2>&1 & )']
    raise _Refused(f"config step {kind} is not supported")


def _display_step(step: Any) -> list[str] | None:
    """A config step after the launch / open that drives the display (activate_window, a pyautogui script) as
    start-script lines, mapped as the finish script's steps are; None where `_step` decides: any other step,
    and a pyautogui script the mapping refuses (a click: skipped and noted, as before the launch)."""
    if not isinstance(step, dict) or not drives_gui(step):
        return None
    params = step.get("parameters") or {}
    if params.get("until"):
        return None
    try:
        shell_line = (_shell(params.get("command"), bool(params.get("shell", False)))
                      if step.get("type") in ("execute", "command") else None)
        return start_lines(step, shell_line)
    except NotMapped as exc:
        if step.get("type") in GUI_POSTCONFIG:
            raise _Refused(f"config step {exc}") from None
        return None


def _kept_output(step: Any) -> dict[str, str]:
    """An execute / command step's `stdout` / `stderr`: the names OSWorld writes its output under in its cache
    dir, for a cache_file getter (plain file names)."""
    if not isinstance(step, dict) or step.get("type") not in ("execute", "command"):
        return {}
    params = step.get("parameters") or {}
    kept = {k: params[k] for k in ("stdout", "stderr") if params.get(k)}
    for name in kept.values():
        if not isinstance(name, str) or name in (".", "..") or any(c in name for c in "/\\\0"):
            raise _Refused(f"malformed postconfig output name {name!r:.80}")
    return kept


def _getter(g: Any, task_id: str, cache: Path | None, files: dict[str, str],
            post: list[Any]) -> dict[str, Any] | None:
    if not g:
        return None
    if not isinstance(g, dict):
        raise _Refused(f"malformed getter {g!r:.80}")
    kind = g.get("type")
    if kind == "rule":
        return {"type": "rule", "rules": g.get("rules")}
    if kind == "vm_command_line":
        return {"type": "vm_command_line", "command": _shell(g.get("command"), bool(g.get("shell", False)))}
    if kind in ("vm_file", "cloud_file"):
        paths, dests = (g.get("path"), g.get("dest")) if g.get("multi") else ([g.get("path")], [g.get("dest")])
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise _Refused(f"{kind}: malformed path {g.get('path')!r:.80}")
        if g.get("time_suffix"):
            raise _Refused(f"{kind} with time_suffix is not supported")
        if kind == "vm_file":
            return {"type": "vm_file", "paths": [_home_path(p) for p in paths], "gives": g.get("gives", [0])}
        for url, dest in zip(paths, dests or []):
            files.setdefault(dest, base64.b64encode(_local_copy(cache, task_id, dest, url)).decode())
        return {"type": "cloud_file", "paths": list(dests or []), "gives": g.get("gives", [0])}
    if kind == "cache_file":  # OSWorld's cache dir holds downloads too; forge maps a postconfig's kept output
        kept = {name for step in post if isinstance(step, dict) for name in (step.get("stdout"), step.get("stderr"))}
        if g.get("path") not in kept:
            raise _Refused(f"cache_file {g.get('path')!r:.80}: only a postconfig step's stdout / stderr is mapped")
        return {"type": "cache_file", "paths": [g["path"]]}
    raise _Refused(f"getter {kind} is not supported (supported: vm_file, vm_command_line, rule, cloud_file, "
                   "cache_file)")


def _as_list(value: Any, n: int) -> list[Any]:
    return value if isinstance(value, list) else [value] * n if n == 1 else value


def _evaluator(ev: Any, task_id: str, cache: Path | None, apps: dict[str, str]) -> dict[str, Any]:
    if not isinstance(ev, dict) or "func" not in ev:
        raise _Refused("malformed: no evaluator with a func")
    funcs = ev["func"] if isinstance(ev["func"], list) else [ev["func"]]
    if not funcs or not all(isinstance(f, str) and f for f in funcs):
        raise _Refused(f"malformed: evaluator func {ev['func']!r}")
    if funcs == ["infeasible"]:
        return {"funcs": funcs}
    if unknown := sorted({f for f in funcs if f not in METRIC_MODULES}):
        raise _Refused(f"metric {', '.join(map(str, unknown))} is not supported (supported: "
                       f"{', '.join(sorted(METRIC_MODULES))}, infeasible)")
    n, files, post, finish = len(funcs), {}, [], []
    steps = ev.get("postconfig") or []
    on_display = any(drives_gui(step) for step in steps)  # then every step is the desktop's finish script
    for step in steps:
        if isinstance(step, dict) and step.get("type") not in ("execute", "command", "sleep", *GUI_POSTCONFIG):
            raise _Refused(f"postconfig step {step.get('type')} drives an application after the agent "
                           "(forge grades once every agent process is gone)")
        kept = _kept_output(step)
        if not on_display:
            got = _step(step, task_id, cache, files, apps)
            post += [{"line": got[0], **kept}] if kept and got else got
            continue
        if kept:
            raise _Refused("a postconfig step's output kept for cache_file beside steps on the display is not "
                           "supported")
        if step.get("type") == "sleep":
            finish += _step(step, task_id, cache, files, apps)
            continue
        params = step.get("parameters") or {}
        if params.get("until"):
            raise _Refused(f"postconfig step {step['type']} with `until` (polling the output) is not supported")
        try:
            finish += finish_line(step, _shell(params.get("command"), bool(params.get("shell", False)))
                                  if step["type"] in ("execute", "command") else None)
        except NotMapped as exc:
            raise _Refused(str(exc)) from None
    results = _as_list(ev.get("result"), n)
    expected = _as_list(ev.get("expected"), n) if ev.get("expected") else []
    options = _as_list(ev.get("options") or ({} if n == 1 else [{}] * n), n)
    if not isinstance(results, list) or not isinstance(options, list) or not isinstance(expected, list):
        raise _Refused("malformed evaluator: result / expected / options do not match func")
    return {"funcs": funcs, "conj": ev.get("conj", "and"), "postconfig": post,
            "result": [_getter(g, task_id, cache, files, post) for g in results],
            "expected": [_getter(g, task_id, cache, files, post) for g in expected],
            "options": [o or {} for o in options], "files": files, "finish": finish}


def convert_task(raw: Any, where: str, cache: Path | None = None) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """(the forge task record, the applications its setup starts: name -> binary, notes on skipped GUI-only
    setup steps); raises _Refused with every reason, unsupported before online-only: a task the internet
    would not make runnable is unsupported."""
    if not isinstance(raw, dict) or not isinstance(raw.get("id"), str) or not isinstance(raw.get("instruction"), str):
        raise _Refused("malformed: an OSWorld task is a JSON object with id, instruction, config, evaluator")
    domain = PurePosixPath(where).parent.name
    if "windows" in (part.lower() for part in PurePosixPath(where).parts[:-1]):
        raise _Refused("a Windows task (forge's sandboxes are Linux)")
    task_id, files, apps = raw["id"], {}, {}
    if not _ID_RE.match(task_id):
        raise _Refused(f"malformed: id {task_id!r:.80} (letters, digits, . _ -)")
    refused: list[_Refused] = []
    ev: dict[str, Any] = {}
    try:
        ev = _evaluator(raw.get("evaluator"), task_id, cache, apps)
    except _Refused as exc:
        refused.append(exc)
    lines: list[str] = []
    start: list[str] = []  # from the first launch / open on: run on the desktop's display
    notes: list[str] = []
    on_display = False  # a step after the launch drives the display (xdotool, START_PRELUDE's functions)
    for step in raw.get("config") or []:
        try:
            got = _display_step(step) if start else None
            on_display = on_display or got is not None
            got = got if got is not None else _step(step, task_id, cache, files, apps, notes)
        except _Refused as exc:
            refused.append(exc)
            continue
        if start or (isinstance(step, dict) and step.get("type") in ("launch", "open")):
            start += got
        else:
            lines += got
    raw_ev = raw.get("evaluator") if isinstance(raw.get("evaluator"), dict) else {}
    if not start and any(drives_gui(step) for step in raw_ev.get("postconfig") or []):
        refused.append(_Refused("postconfig drives an application after the agent, but the task starts none on "
                                "a desktop (no launch or open step)"))
    if refused:
        first = sorted(refused, key=lambda e: e.online)[0]  # an unsupported reason before an online one
        reasons = list(dict.fromkeys(str(e) for e in sorted(refused, key=lambda e: e.online)))
        raise _Refused("; ".join(reasons), online=first.online)
    ev["source"], finish = f"{domain}/{task_id}", ev.pop("finish", [])
    if finish or on_display:  # OSWorld's steps on the display (rollouts/tasks/osworld/finish.py)
        apps["xdotool"] = "xdotool"
    try:
        OSWorldEval.model_validate(ev)
    except ValidationError as exc:
        raise _Refused(f"malformed evaluator: {exc.errors()[0]['msg']}") from None
    # OSWorld ships no reference solutions; an infeasible task's is its answer, FAIL (`forge tasks validate --run`)
    solution = (f"mkdir -p {PurePosixPath(ANSWER_FILE).parent} && printf FAIL > {ANSWER_FILE}"
                if ev["funcs"] == ["infeasible"] else None)
    record = {"id": task_id, "instruction": raw["instruction"].replace("/home/user/", "") + HOME_NOTE,
              "files": files, "setup": "\n".join(["set -e", 'export OSW_HOME="$PWD"', *lines]) if lines else None,
              "family": {"kind": "osworld", "evaluator": ev, **({"desktop": {
                  "apps": list(dict.fromkeys(apps.values())),
                  "start": "\n".join(["set -e", 'export OSW_HOME="$PWD"', *([START_PRELUDE] if on_display else []),
                                      *start]),
                  **({"finish": finish_script(finish)} if finish else {})}} if start else {})},
              "solution": solution, "time_limit_s": TIME_LIMIT_S, "requires_tools": True,
              "tags": ["osworld", domain, *(f"needs:{a}" for a in sorted(apps))]}
    return {k: v for k, v in record.items() if v is not None}, apps, notes


def _task_files(src: Path) -> list[Path]:
    if src.is_file():
        return [src]
    for root in (src / "evaluation_examples" / "examples", src / "examples", src):
        if root.is_dir():
            found = sorted(p for p in root.rglob("*.json") if p.name != "template.json")
            if found:
                return found
    raise TaskError(f"{src} holds no OSWorld task files (evaluation_examples/examples/<domain>/<id>.json)")


def import_osworld(src: str | Path, *, cache: str | Path | None = None) -> OSWorldImport:
    """Every OSWorld-format task under SRC: converted, or refused with a reason."""
    src_path = Path(src).expanduser()
    if not src_path.exists():
        raise TaskError(f"no such OSWorld task file or folder: {src}")
    cache_path = Path(cache).expanduser() if cache else None
    report = OSWorldImport()
    seen: dict[str, Path] = {}
    for path in _task_files(src_path):
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            report.unsupported.append((path.stem, f"malformed: {exc}"))
            continue
        task_id = raw.get("id", path.stem) if isinstance(raw, dict) else path.stem
        if isinstance(task_id, str) and task_id in seen:
            report.unsupported.append((task_id, f"duplicate id (first at {seen[task_id]})"))
            continue
        try:
            record, apps, notes = convert_task(raw, str(path), cache_path)
        except _Refused as exc:
            (report.online_only if exc.online else report.unsupported).append((str(task_id), str(exc)))
            continue
        except (KeyError, TypeError, ValueError) as exc:
            report.unsupported.append((str(task_id), f"malformed: {type(exc).__name__}: {exc}"))
            continue
        report.tasks.append(record)
        seen[task_id] = path
        report.notes += [(task_id, note) for note in notes]
        # a desktop task runs here when its applications do (rollouts/tasks/desktop/task.py; docs/tasks.md)
        if missing := sorted(label for label, binary in apps.items() if shutil.which(binary) is None):
            report.not_here.append((task_id, f"needs {', '.join(sorted(apps))} on a desktop (not installed "
                                             f"here: {', '.join(missing)})"))
        elif "sudo " in json.dumps([record.get("setup", ""), record["family"]["evaluator"].get("postconfig", []),
                                    record["family"].get("desktop", {}).get("finish", "")]):
            report.not_here.append((task_id, "needs root in the sandbox (sudo)"))
        elif "gsettings " in json.dumps(record) and shutil.which("dbus-launch") is None:
            # dconf writes through a session bus it autolaunches: without one a `gsettings set` is lost
            report.not_here.append((task_id, "sets or reads settings through gsettings, which do not persist "
                                             "without a D-Bus session (no dbus-launch here)"))
    return report
