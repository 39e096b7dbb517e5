"""OSWorld's check_list (general.py: regexes over a postconfig command's output, read back with the cache_file
getter) and compare_pdfs (chrome.py: PyMuPDF's text of each PDF, rapidfuzz's ratio) on task files made here,
imported by rollouts/tasks/osworld/importer.py and graded through the runner by OSWorld's own functions."""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path

from typer.testing import CliRunner

from openforge.forge_cli.main import app
from openforge.rollouts.tasks.format import TaskSpec
from openforge.rollouts.tasks.osworld.importer import import_osworld
from openforge.rollouts.tasks.osworld.payload import OSWorldPayload
from openforge.store import Store
from tests.helpers.osworld import _run, _task, needs_office

PDF_URL, GOLD_PDF_URL = "https://drive.google.com/uc?id=input-pdf", "https://drive.google.com/uc?id=gold-pdf"
LISTED = _task("listed", "In /home/user, keep report.txt and remove every draft.", [
    {"type": "execute", "parameters": {"command": "touch /home/user/draft-1.txt", "shell": True}}], {
    "postconfig": [{"type": "execute", "parameters": {"command": ["ls", "-1", "/home/user"], "stdout": "ls.out"}}],
    "func": "check_list", "result": {"type": "cache_file", "path": "ls.out"},
    "expected": {"type": "rule", "rules": {"expect": [r"^report\.txt$"], "unexpect": ["draft"]}}})


def _pdf(lines: list[str]) -> bytes:
    import fitz  # PyMuPDF, what compare_pdfs reads with

    doc = fitz.open()
    page = doc.new_page()
    for i, line in enumerate(lines):
        page.insert_text((72, 72 + 20 * i), line)
    return doc.tobytes()


def _import(tmp_path: Path, *tasks: dict, cache: Path | None = None):  # type: ignore[no-untyped-def]
    folder = tmp_path / "src" / "evaluation_examples" / "examples" / "multi_apps"
    folder.mkdir(parents=True, exist_ok=True)
    for raw in tasks:
        (folder / f"{raw['id']}.json").write_text(json.dumps(raw), encoding="utf-8")
    return import_osworld(tmp_path / "src", cache=cache)


@needs_office
async def test_check_list_grades_the_postconfig_output_kept_on_the_host(store: Store, tmp_path: Path) -> None:
    report = _import(tmp_path, LISTED)
    task = TaskSpec.model_validate(report.tasks[0])
    osworld = task.payload(OSWorldPayload)
    assert osworld is not None and osworld.evaluator.postconfig[0].model_dump() == {
        "line": "ls -1 \"$OSW_HOME\"", "stdout": "ls.out", "stderr": None}
    got = await _run(store, task, {
        "done": "rm draft-1.txt && touch report.txt",
        "draft kept": "touch report.txt",  # an `unexpect` line: 0
        "idle": "true",
        # the output's name written by the agent: the grader reads what the postconfig printed, never this
        "planted": "rm draft-1.txt && printf 'report.txt\\n' > ls.out"})
    assert {k: v[:2] for k, v in got.items()} == {
        "done": ("scored", 1.0), "draft kept": ("scored", 0.0), "idle": ("scored", 0.0), "planted": ("scored", 0.0)}, got
    assert "check_list: 1" in got["done"][2]


@needs_office
async def test_compare_pdfs_grades_the_pdf_read_out_against_the_hosts_copy(store: Store, tmp_path: Path) -> None:
    gold, start = _pdf(["Invoice 2026-12", "Total: 1250 EUR"]), _pdf(["Invoice draft"])
    raw = _task("invoice", "Write the invoice to /home/user/invoice.pdf.", [
        {"type": "download", "parameters": {"files": [{"url": PDF_URL, "path": "/home/user/invoice.pdf"}]}}],
        {"func": "compare_pdfs", "result": {"type": "vm_file", "path": "/home/user/invoice.pdf", "dest": "invoice.pdf"},
         "expected": {"type": "cloud_file", "path": GOLD_PDF_URL, "dest": "gold.pdf"}})
    cache = tmp_path / "cache" / "invoice"
    cache.mkdir(parents=True)
    (cache / f"{uuid.uuid5(uuid.NAMESPACE_URL, PDF_URL)}_invoice.pdf").write_bytes(start)
    (cache / "gold.pdf").write_bytes(gold)
    report = _import(tmp_path, raw, cache=tmp_path / "cache")
    assert not report.unsupported and not report.online_only, (report.unsupported, report.online_only)
    task = TaskSpec.model_validate(report.tasks[0])
    b64 = {name: base64.b64encode(data).decode() for name, data in (("right", gold), ("other", _pdf(["zzz"])))}
    got = await _run(store, task, {
        "right": f"echo {b64['right']} | base64 -d > invoice.pdf",
        "other": f"echo {b64['other']} | base64 -d > invoice.pdf",  # no character in common: ratio 0
        "planted": f"echo {b64['right']} | base64 -d > gold.pdf && rm invoice.pdf",
        "not a pdf": "echo 'Invoice 2026-12 Total: 1250 EUR' > invoice.pdf"})
    assert {k: v[:2] for k, v in got.items()} == {
        "right": ("scored", 1.0), "other": ("scored", 0.0), "planted": ("scored", 0.0),
        "not a pdf": ("scored", 0.0)}, got
    assert "compare_pdfs: 1" in got["right"][2]


def test_a_cache_file_no_postconfig_keeps_is_refused_with_its_reason(tmp_path: Path) -> None:
    unkept = {**LISTED, "id": "unkept", "evaluator": {**LISTED["evaluator"], "result": {"type": "cache_file",
                                                                                      "path": "other.out"}}}
    on_display = {**LISTED, "id": "on-display", "config": [{"type": "launch", "parameters": {"command": ["xedit"]}}],
                  "evaluator": {**LISTED["evaluator"], "postconfig": [
                      {"type": "activate_window", "parameters": {"window_name": "xedit"}},
                      *LISTED["evaluator"]["postconfig"]]}}
    report = _import(tmp_path, unkept, on_display)
    assert report.tasks == [] and dict(report.unsupported) == {
        "unkept": "cache_file 'other.out': only a postconfig step's stdout / stderr is mapped",
        "on-display": "a postconfig step's output kept for cache_file beside steps on the display is not supported"}
    # a task record edited by hand the same way: one line from `tasks validate`
    good = _import(tmp_path / "2", LISTED).tasks[0]
    bad = {**good, "id": "bad", "family": {**good["family"], "evaluator": {**good["family"]["evaluator"],
                                                                         "postconfig": ["ls"]}}}
    (tmp_path / "set.jsonl").write_text(json.dumps(bad) + "\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["tasks", "validate", str(tmp_path / "set.jsonl")])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "cache_file: no postconfig step keeps ls.out" in result.output, result.output
