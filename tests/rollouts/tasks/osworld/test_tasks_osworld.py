"""The OSWorld-format importer (rollouts/tasks/osworld/importer.py) on small task files in OSWorld's layout
(evaluation_examples/examples/<domain>/<id>.json) made here: what is imported, what is refused and why;
and imported tasks run through the runner in a local sandbox, graded after the agent by the getters in
the sandbox and OSWorld's own metric functions (the desktop-env package) on the host."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from openforge.config import ForgeConfig
from openforge.forge_cli.main import app
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import TaskSpec, load_tasks
from openforge.rollouts.tasks.osworld.importer import import_osworld
from openforge.rollouts.tasks.osworld.evaluator import OSWorldEval
from openforge.rollouts.tasks.osworld.kind import planted_files
from openforge.rollouts.tasks.osworld.payload import OSWorldPayload
from openforge.rollouts.tasks.selfcheck import _StandInHarness, check_solutions
from openforge.store import Store
from tests.helpers.osworld import (
    EXPECTED_URL, INPUT_URL, TASKS, _metrics_missing, _run, _task, _write_set, needs_office,
)
from tests.helpers.required import requires


def _ev(task: TaskSpec) -> OSWorldEval:
    """The task's OSWorld evaluator (its family payload's)."""
    payload = task.payload(OSWorldPayload)
    assert payload is not None
    return payload.evaluator


needs_osworld = requires("osworld", _metrics_missing())


def _xlsx(rows: list[list[object]]) -> bytes:
    import openpyxl

    wb = openpyxl.Workbook()
    for row in rows:
        wb.active.append(row)
    buf = io.BytesIO()
    wb.save(buf)
    return buf.getvalue()


def _cache(root: Path) -> Path:
    """OSWorld's cache layout: CACHE/<task id>/<uuid5(url)>_<name> for downloads, CACHE/<task id>/<dest>
    for an expected (cloud) file."""
    task = root / "cache" / "total"
    task.mkdir(parents=True)
    (task / f"{uuid.uuid5(uuid.NAMESPACE_URL, INPUT_URL)}_sheet.xlsx").write_bytes(_xlsx([["item", "cost"], ["a", 2], ["b", 3]]))
    (task / "gold.xlsx").write_bytes(_xlsx([["item", "cost"], ["a", 2], ["b", 3], ["TOTAL", 5]]))
    return root / "cache"


def test_the_import_maps_steps_and_getters_and_says_why_it_refused(tmp_path: Path) -> None:
    src = _write_set(tmp_path)
    offline = import_osworld(src)  # no local copies: the downloads make `total` online-only
    assert sorted(t["id"] for t in offline.tasks) == ["impossible", "shout"]
    assert dict(offline.online_only) == {
        "tabs": "config step chrome_open_tabs needs the internet",
        "total": f"{EXPECTED_URL} has no local copy (no --cache given); {INPUT_URL} has no local copy (no --cache given)"}
    unsupported = dict(offline.unsupported)
    assert unsupported["slides"].startswith("metric check_slide_orientation_Portrait is not supported")
    assert unsupported["playing"].startswith("getter vlc_playing_info is not supported")
    assert unsupported["saved"] == ("postconfig drives an application after the agent, but the task starts none on "
                                    "a desktop (no launch or open step)")
    assert unsupported["broken"].startswith("malformed:")
    assert offline.notes == [("shout", "skipped a setup step that only drives the GUI: python -c 'import pyautogui; "
                                       "pyautogui.click(960, 540)'")]

    report = import_osworld(src, cache=_cache(tmp_path))
    total = TaskSpec.model_validate(next(t for t in report.tasks if t["id"] == "total"))
    assert _ev(total).funcs == ["compare_table"]
    assert (_ev(total).result[0].type, _ev(total).result[0].paths) == ("vm_file", ["sheet.xlsx"])
    assert base64.b64decode(_ev(total).files["gold.xlsx"]).startswith(b"PK")  # on the host, in the record
    assert "gold.xlsx" not in json.dumps(total.files)  # never among the files the agent's sandbox gets
    assert "needs:LibreOffice" in total.tags and total.setup and "base64 -d .forge-osworld/0.b64" in total.setup
    assert total.instruction.startswith("Add a row TOTAL with the sum of column B to sheet.xlsx.\n\n(OSWorld-format")
    shout = TaskSpec.model_validate(next(t for t in report.tasks if t["id"] == "shout"))
    assert _ev(shout).result[0].command == "cat $OSW_HOME/out.txt"
    home = tmp_path / "home"  # the setup line, run as the sandbox runs it: OSWorld's /home/user is its folder
    home.mkdir()
    assert shout.setup and subprocess.run(["sh", "-c", shout.setup], cwd=home).returncode == 0
    assert (home / "in.txt").read_text() == "hello world"
    # a task file cannot reach outside the cache folder for its "local copy"
    escape = tmp_path / "escape.json"
    escape.write_text(json.dumps({**TASKS["libreoffice_calc/total"], "id": "../../etc"}), encoding="utf-8")
    assert import_osworld(escape, cache=tmp_path / "cache").unsupported == [
        ("../../etc", "malformed: id '../../etc' (letters, digits, . _ -)")]
    impossible = TaskSpec.model_validate(next(t for t in report.tasks if t["id"] == "impossible"))
    assert _ev(impossible).infeasible and impossible.solution


def test_forge_tasks_import_osworld_writes_a_valid_set(tmp_path: Path) -> None:
    src, out = _write_set(tmp_path), tmp_path / "imported"
    result = CliRunner().invoke(app, ["tasks", "import", "osworld", str(src), "--out", str(out),
                                      "--cache", str(_cache(tmp_path))])
    assert result.exit_code == 0, result.output
    assert "8 OSWorld-format task(s): 3 imported" in result.output
    assert "1 online-only, 4 unsupported" in result.output
    assert "slides: unsupported: metric check_slide_orientation_Portrait" in result.output
    assert sorted(t.id for t in load_tasks(out)) == ["impossible", "shout", "total"]
    bad = CliRunner().invoke(app, ["tasks", "import", "osworld", str(tmp_path / "nowhere")])
    assert bad.exit_code != 0 and "no such OSWorld task file or folder" in bad.output
    assert "Traceback" not in bad.output


@needs_osworld
async def test_a_command_line_task_is_graded_by_osworlds_metric(store: Store, tmp_path: Path) -> None:
    report = import_osworld(_write_set(tmp_path))
    task = TaskSpec.model_validate(next(t for t in report.tasks if t["id"] == "shout"))
    got = await _run(store, task, {
        "done": "tr a-z A-Z < in.txt > out.txt",
        "lower": "cp in.txt out.txt",  # the exclude rule: the original words must be gone
        "idle": "true",
        "gave up": "tr a-z A-Z < in.txt > out.txt"}, answers={"gave up": "FAIL"})
    assert {k: v[:2] for k, v in got.items()} == {
        "done": ("scored", 1.0), "lower": ("scored", 0.0), "idle": ("scored", 0.0), "gave up": ("scored", 0.0)}, got
    assert "check_include_exclude: 1" in got["done"][2]
    assert "answered FAIL on a feasible task" in got["gave up"][2]


@needs_osworld
async def test_a_spreadsheet_task_is_graded_on_the_file_read_out_after_the_agent(store: Store, tmp_path: Path) -> None:
    report = import_osworld(_write_set(tmp_path), cache=_cache(tmp_path))
    record = next(t for t in report.tasks if t["id"] == "total")
    # forge runs no LibreOffice here: the desktop (the `open` step) is taken out, the sheet is still put in place
    assert record["family"]["desktop"] == {"apps": ["soffice"], "start": 'set -e\nexport OSW_HOME="$PWD"\n'
                                 '( soffice "$OSW_HOME"/sheet.xlsx >/dev/null 2>&1 & )'}
    del record["family"]["desktop"]
    task = TaskSpec.model_validate(record)
    right = base64.b64encode(_xlsx([["item", "cost"], ["a", 2], ["b", 3], ["TOTAL", 5]])).decode()
    wrong = base64.b64encode(_xlsx([["item", "cost"], ["a", 2], ["b", 3], ["TOTAL", 6]])).decode()
    got = await _run(store, task, {
        "right": f"echo {right} | base64 -d > sheet.xlsx",
        "wrong": f"echo {wrong} | base64 -d > sheet.xlsx",
        # the gold file planted beside the result and as the result's name in other folders: still graded
        # on the sheet itself, against the host's copy
        "planted": f"echo {right} | base64 -d > gold.xlsx && mkdir -p .forge-osworld && cp gold.xlsx .forge-osworld/",
        "junk": planted_files(task),
        "link out": "rm sheet.xlsx && ln -s /etc/passwd sheet.xlsx",
        "untouched": "true"})
    assert {k: v[:2] for k, v in got.items()} == {
        "right": ("scored", 1.0), "wrong": ("scored", 0.0), "planted": ("scored", 0.0), "junk": ("scored", 0.0),
        "link out": ("scored", 0.0), "untouched": ("scored", 0.0)}, got
    assert "compare_table: 1" in got["right"][2] and "compare_table: 0" in got["wrong"][2]


@needs_osworld
async def test_validate_run_passes_the_infeasible_answer_and_credits_no_hostile_one(store: Store, tmp_path: Path) -> None:
    report = import_osworld(_write_set(tmp_path))
    tasks = [TaskSpec.model_validate(t) for t in report.tasks]  # impossible (infeasible), shout (no solution)
    assert await check_solutions(store, ForgeConfig(), tasks) == []  # `shout` has no reference: not a failure
    (run,) = [r for r in store.list_runs() if r.name == "tasks validate --run"]
    rollouts = store.list_rollouts(run.id)
    # FAIL for `impossible`, the six hostile answers in each task, an idle agent and planted files in `shout`
    assert len(rollouts) == 1 + 2 * 6 + 1 + 1
    assert sorted((r.status, r.reward) for r in rollouts) == [("scored", 0.0)] * 14 + [("scored", 1.0)]


def test_a_bad_osworld_record_is_one_line_per_problem_from_validate(tmp_path: Path) -> None:
    good = import_osworld(_write_set(tmp_path)).tasks[0]
    bad = {**good, "id": "bad", "family": {**good["family"], "evaluator": {**good["family"]["evaluator"],
                                                                         "funcs": ["compare_pdf_images"]}}}
    (tmp_path / "set.jsonl").write_text(json.dumps(bad) + "\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["tasks", "validate", str(tmp_path / "set.jsonl")])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "family.osworld.evaluator: metric compare_pdf_images is not supported" in result.output


async def test_a_metric_that_cannot_run_is_an_infrastructure_failure(store: Store, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """OSWorld's package missing (or a metric process that dies) is the machinery's failure, never a 0."""
    import sys

    from openforge.rollouts.tasks.osworld import evaluator as osworld_eval

    monkeypatch.setattr(osworld_eval, "METRIC_COMMAND", [sys.executable, "-c", "import sys; sys.exit(3)"])
    report = import_osworld(_write_set(tmp_path))
    task = TaskSpec.model_validate(next(t for t in report.tasks if t["id"] == "shout"))
    run = store.create_run(kind="check", name="osworld-infra")
    runner = RolloutRunner(store, config=ForgeConfig(), proxy_url="http://127.0.0.1:9",
                           harness=_StandInHarness({task.id: "tr a-z A-Z < in.txt > out.txt"}))
    (ro,) = await runner.run(run.id, [RolloutSpec(task)])
    assert (ro.status, ro.failure_kind, ro.reward) == ("failed", "infra", None), ro.error
    assert "OSWorld metric check_include_exclude died (exit 3)" in ro.error


DOC_URL, GOLD_DOC_URL = "https://drive.google.com/uc?id=input-doc", "https://drive.google.com/uc?id=gold-doc"


def _docx(paragraphs: list[str]) -> bytes:
    import docx

    doc = docx.Document()
    for text in paragraphs:
        doc.add_paragraph(text)
    buf = io.BytesIO()
    doc.save(buf)
    return buf.getvalue()


def _pptx(titles: list[str]) -> bytes:
    import pptx

    deck = pptx.Presentation()
    for title in titles:
        deck.slides.add_slide(deck.slide_layouts[5]).shapes.title.text = title
    buf = io.BytesIO()
    deck.save(buf)
    return buf.getvalue()


async def _office_task(store: Store, tmp_path: Path, func: str, name: str, start: bytes, gold: bytes,
                       wrong: bytes) -> tuple[TaskSpec, dict[str, tuple[str, float | None, str]]]:
    """An OSWorld-format task whose file (downloaded at setup) must become the gold one, graded by
    OSWorld's `func` against the host's copy; run with the right file, a wrong one, the gold copy planted
    beside it, nothing done, and the file deleted."""
    task_id = name.split(".")[0]
    record = _task(task_id, f"Fix /home/user/{name}.", [
        {"type": "download", "parameters": {"files": [{"url": DOC_URL, "path": f"/home/user/{name}"}]}}],
        {"func": func, "result": {"type": "vm_file", "path": f"/home/user/{name}", "dest": name},
         "expected": {"type": "cloud_file", "path": GOLD_DOC_URL, "dest": f"gold-{name}"}, "options": {}})
    examples = tmp_path / "evaluation_examples" / "examples" / "office"
    examples.mkdir(parents=True)
    (examples / f"{task_id}.json").write_text(json.dumps(record), encoding="utf-8")
    cache = tmp_path / "cache" / task_id
    cache.mkdir(parents=True)
    (cache / f"{uuid.uuid5(uuid.NAMESPACE_URL, DOC_URL)}_{name}").write_bytes(start)
    (cache / f"gold-{name}").write_bytes(gold)
    report = import_osworld(tmp_path, cache=tmp_path / "cache")
    assert not report.unsupported and not report.online_only, (report.unsupported, report.online_only)
    task = TaskSpec.model_validate(report.tasks[0])
    right = base64.b64encode(gold).decode()
    got = await _run(store, task, {
        "right": f"echo {right} | base64 -d > {name}",
        "wrong": f"echo {base64.b64encode(wrong).decode()} | base64 -d > {name}",
        "planted": f"mkdir -p done && echo {right} | base64 -d > done/{name} && echo {right} | base64 -d > gold-{name}",
        "untouched": "true",
        "deleted": f"rm {name}"})  # the getter's None: python-pptx would open its default deck for it
    return task, got


@needs_office
async def test_a_writer_task_is_graded_by_osworlds_compare_docx_files(store: Store, tmp_path: Path) -> None:
    start, gold, wrong = (_docx(["Dear team,", text]) for text in (
        "the meeting is on monday.", "The meeting is on Monday.", "The meeting is on Tuesday."))
    task, got = await _office_task(store, tmp_path, "compare_docx_files", "memo.docx", start, gold, wrong)
    assert _ev(task).funcs == ["compare_docx_files"]
    assert {k: v[:2] for k, v in got.items()} == {
        "right": ("scored", 1.0), "wrong": ("scored", 0.0), "planted": ("scored", 0.0), "untouched": ("scored", 0.0),
        "deleted": ("scored", 0.0)}, got
    assert "compare_docx_files: 1" in got["right"][2] and "compare_docx_files: 0" in got["wrong"][2]


@needs_office
async def test_an_impress_task_is_graded_by_osworlds_compare_pptx_files(store: Store, tmp_path: Path) -> None:
    start, gold, wrong = _pptx(["Plan", "Budget"]), _pptx(["Plan", "Budget 2027"]), _pptx(["Plan", "Budget 2026"])
    _, got = await _office_task(store, tmp_path, "compare_pptx_files", "deck.pptx", start, gold, wrong)
    assert {k: v[:2] for k, v in got.items()} == {
        "right": ("scored", 1.0), "wrong": ("scored", 0.0), "planted": ("scored", 0.0), "untouched": ("scored", 0.0),
        "deleted": ("scored", 0.0)}, got
    assert "compare_pptx_files: 1" in got["right"][2] and "compare_pptx_files: 0" in got["untouched"][2]


@needs_office
def test_a_metric_that_touches_a_stood_in_import_is_unavailable_not_a_score(tmp_path: Path) -> None:
    """docs.py's compare_image_text calls easyocr inside its own `except Exception: return 0`: with the
    stand-in the call ends the metric as unavailable (exit 2), never the 0 that except would give."""
    image = tmp_path / "shot.png"
    image.write_bytes(b"\x89PNG\r\n\x1a\n")
    script = ("import sys; from openforge.rollouts.tasks.osworld import metric as m; "
              "m.METRIC_MODULES['compare_image_text'] = 'docs'; sys.exit(m.main())")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          input=json.dumps({"func": "compare_image_text", "result": str(image),
                                            "expected": {"type": "text", "text": "hello"}}))
    assert done.returncode == 2, done.stderr
    assert "the metric used easyocr.Reader, which forge does not install" in json.loads(done.stdout)["unavailable"]


@needs_office
def test_every_metric_forge_names_loads_from_osworlds_package() -> None:
    """Each METRIC_MODULES entry is OSWorld's function from its module (a child process: the stand-ins
    stay out of this one)."""
    script = ("from openforge.rollouts.tasks.osworld.metric import METRIC_MODULES, load_metric\n"
              "for name, module in METRIC_MODULES.items():\n"
              "    f = load_metric(name)\n"
              "    assert (f.__name__, f.__module__) == (name, f'desktop_env.evaluators.metrics.{module}'), f\n"
              "print(len(METRIC_MODULES))")
    from openforge.rollouts.tasks.osworld.metric import METRIC_MODULES

    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == str(len(METRIC_MODULES)), done.stderr


@pytest.mark.parametrize("command", [{"command": "GDK_BACKEND=x11 LANG=C xedit /home/user/note.txt", "shell": True},
                                     {"command": "GDK_BACKEND=x11 LANG=C xedit /home/user/note.txt"},
                                     {"command": ["GDK_BACKEND=x11", "LANG=C", "xedit", "/home/user/note.txt"]},
                                     {"command": ["env", "GDK_BACKEND=x11", "xedit", "/home/user/note.txt"]}])
def test_a_launch_with_an_environment_prefix_starts_its_program(tmp_path: Path, command: dict) -> None:
    """Issue 44: `VAR=1 app --flag` was imported as the program `VAR=1` (a quoted word the shell runs as a
    command) and the set failed validation. The program is the first word that is no assignment (nor `env`);
    the assignments stay assignments."""
    raw = {"id": "env-prefix", "instruction": "Write hello in /home/user/note.txt.",
           "config": [{"type": "launch", "parameters": command}],
           "evaluator": {"func": "check_include_exclude",
                         "result": {"type": "vm_command_line", "command": "cat /home/user/note.txt", "shell": True},
                         "expected": {"type": "rule", "rules": {"include": ["hello"], "exclude": []}}}}
    folder = tmp_path / "src" / "evaluation_examples" / "examples" / "os"
    folder.mkdir(parents=True)
    (folder / "env-prefix.json").write_text(json.dumps(raw))
    report = import_osworld(tmp_path / "src")
    assert report.unsupported == [] and len(report.tasks) == 1, report.unsupported
    record = report.tasks[0]
    assert "needs:xedit" in record["tags"] and not any("=" in tag for tag in record["tags"])
    desktop = TaskSpec.model_validate(record).payload(OSWorldPayload).desktop  # type: ignore[union-attr]
    assert desktop is not None
    start = desktop.start
    assert "GDK_BACKEND=x11" in start and "'GDK_BACKEND=x11'" not in start and "xedit" in start
    (tmp_path / "set.jsonl").write_text(json.dumps(record) + "\n")
    result = CliRunner().invoke(app, ["tasks", "validate", str(tmp_path / "set.jsonl")])
    assert result.exit_code == 0, result.output


def test_a_task_set_through_gsettings_is_not_runnable_without_a_d_bus_session(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 44: a setting written with `gsettings set` does not persist without a D-Bus session (dconf cannot
    autolaunch one without dbus-launch), so no correct agent can pass such a task here, yet it was counted as
    runnable. Where dbus-launch is missing it is imported but counted as not runnable here, with the reason."""
    import shutil as shutil_module

    raw = {"id": "lock", "instruction": "Turn the screen lock off.", "config": [],
           "evaluator": {"func": "exact_match",
                         "result": {"type": "vm_command_line", "command": "gsettings get org.gnome.desktop.screensaver "
                                    "lock-enabled", "shell": True},
                         "expected": {"type": "rule", "rules": {"expected": "false\n"}}}}
    folder = tmp_path / "src" / "evaluation_examples" / "examples" / "os"
    folder.mkdir(parents=True)
    (folder / "lock.json").write_text(json.dumps(raw))
    which = shutil_module.which
    got = {}
    for label, has_bus in {"no bus": False, "bus": True}.items():
        monkeypatch.setattr(shutil_module, "which",
                            lambda name, *a, has_bus=has_bus, **k: ("/usr/bin/dbus-launch" if has_bus else None)
                            if name == "dbus-launch" else which(name, *a, **k))
        report = import_osworld(tmp_path / "src")
        assert [t["id"] for t in report.tasks] == ["lock"]
        got[label] = report.not_here
    assert got == {"no bus": [("lock", "sets or reads settings through gsettings, which do not persist without a "
                                       "D-Bus session (no dbus-launch here)")], "bus": []}


def test_runnable_here_counts_only_what_a_reference_passed() -> None:
    """Issue 44: bench/osworld_import.py's "runnable here" counted every imported task whose applications are
    installed, among them tasks no correct agent can pass here. It counts the references that scored."""
    from bench.osworld_import import runnable_here

    tasks = [TaskSpec(id=i, instruction="x", verifier="true", solution=s)
             for i, s in (("passed", "true"), ("failed", "true"), ("broke", "true"), ("none", None))]
    by_task = {"failed": ["the reference solution scores 0 < pass_threshold 1: x"],
               "broke": ["solved attempt ended failed: infra: no display"], "none": []}
    assert runnable_here(tasks, by_task) == ["passed"]
