"""A task folder's files as every loader and importer reads them (rollouts/tasks/setup_files.py, issue 43): a
link that leads out of the task folder is refused, never followed (a `files/leak.txt` linked to a host file
would be copied into every sandbox), and a setup file past the size cap or a folder past the count cap is
refused in one line, judged before anything is read."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from openforge.forge_cli.main import app
from openforge.rollouts.tasks.claweval.importer import convert_task
from openforge.rollouts.tasks.format import load_tasks, validate_tasks
from openforge.rollouts.tasks.osworld.importer import import_osworld
from openforge.rollouts.tasks.setup_files import SetupLimits
from tests.helpers.osworld import INPUT_URL, _write_set

SECRET = "host-secret-7f3a\n"


def _host_secret(tmp_path: Path) -> Path:
    """A host file no task may reach (the issue used /etc/shadow), outside every task folder."""
    (tmp_path / "host").mkdir(exist_ok=True)
    secret = tmp_path / "host" / "shadow"
    secret.write_text(SECRET)
    return secret


def _native(root: Path, name: str, **files: str) -> Path:
    folder = root / name
    (folder / "files").mkdir(parents=True)
    (folder / "task.json").write_text(json.dumps({"instruction": "Look around.", "verifier": "true"}))
    for rel, text in files.items():
        (folder / "files" / rel).write_text(text)
    return folder


def _harbor(root: Path, name: str) -> Path:
    folder = root / name
    for sub in ("environment", "tests"):
        (folder / sub).mkdir(parents=True)
    (folder / "task.toml").write_text('version = "1.0"\n')
    (folder / "instruction.md").write_text("Do it.")
    (folder / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\nCOPY data.txt /app/\n")
    (folder / "environment" / "data.txt").write_text("data\n")
    (folder / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    return folder


def test_a_link_out_of_the_task_folder_is_refused_by_every_loader(tmp_path: Path) -> None:
    secret = _host_secret(tmp_path)
    root = tmp_path / "set"
    (_native(root, "leak") / "files" / "leak.txt").symlink_to(secret)  # the attack
    (_native(root, "folder-leak") / "files" / "etc").symlink_to(secret.parent)
    verifier = _native(root, "verifier-leak") / "verifier"
    verifier.mkdir()
    (verifier / "check.sh").symlink_to(secret)
    (_harbor(root, "harbor-tests") / "tests" / "helper.py").symlink_to(secret)
    env = _harbor(root, "harbor-copy") / "environment"
    (env / "data.txt").unlink()
    (env / "data.txt").symlink_to(secret)

    problems = validate_tasks(root)
    said = " | ".join(f"{p.where} {p.message}" for p in problems)
    assert SECRET.strip() not in said
    for name in ("leak", "folder-leak", "verifier-leak", "harbor-tests"):
        assert any(name in p.where and "is a link out of the task folder" in p.message for p in problems), said
    assert any(p.task_id == "harbor-copy" for p in problems), said  # COPY of a link out: refused, unread
    assert all("\n" not in p.message for p in problems)
    # A link that stays in its task folder is read as the file it names.
    inside = _native(tmp_path / "fine", "inside", **{"real.txt": "mine\n"})
    (inside / "files" / "alias.txt").symlink_to("real.txt")
    [task] = load_tasks(tmp_path / "fine")
    assert task.files == {"alias.txt": "mine\n", "real.txt": "mine\n"}


def test_an_osworld_cache_file_linked_out_is_refused(tmp_path: Path) -> None:
    secret = _host_secret(tmp_path)
    cache = tmp_path / "cache" / "total"  # OSWorld's cache layout (test_tasks_osworld.py), the gold file a link
    cache.mkdir(parents=True)
    (cache / f"{uuid.uuid5(uuid.NAMESPACE_URL, INPUT_URL)}_sheet.xlsx").write_bytes(b"PK sheet")
    (cache / "gold.xlsx").symlink_to(secret)
    cache = cache.parent
    report = import_osworld(_write_set(tmp_path), cache=cache)
    assert "total" not in {t["id"] for t in report.tasks}
    [why] = [why for tid, why in report.unsupported if tid == "total"]
    assert "gold.xlsx is a link out of the task folder" in why and SECRET.strip() not in why


def test_a_setup_file_past_the_cap_is_refused_in_one_line_unread(tmp_path: Path) -> None:
    root = tmp_path / "set"
    big = _native(root, "sparse") / "files" / "disk.img"
    with big.open("wb") as fh:  # 3 GB that take no disk: the took 21 s and 6.5 GB of memory to validate
        fh.truncate(3 << 30)
    _native(root, "many", **{f"f{i}.txt": "x" for i in range(6)})
    started = time.monotonic()
    problems = validate_tasks(root, limits=SetupLimits(max_files=5))
    assert time.monotonic() - started < 2.0
    messages = {p.where.split("/set/", 1)[1]: p.message for p in problems}
    assert messages == {
        "sparse/files/disk.img": "sparse/files/disk.img is 3072 MB, over the 64 MB a task file may be (tasks.max_setup_file_mb)",
        "many/files": "many/files holds more than 5 files (tasks.max_setup_files)"}
    # The caps are the config's: `forge tasks validate` reads them from tasks.max_setup_file_mb / max_setup_files.
    out = CliRunner().invoke(app, ["--set", "tasks.max_setup_file_mb=100", "--set", "tasks.max_setup_files=10",
                                   "tasks", "validate", str(root)])
    assert out.exit_code == 1 and "1 problem(s)" in out.output, out.output
    assert "sparse/files/disk.img is 3072 MB, over the 100 MB a task file may be" in out.output


def test_a_claweval_fixture_past_the_cap_is_refused_unread(tmp_path: Path) -> None:
    task_dir = tmp_path / "claw" / "tasks" / "T01_big"
    (task_dir / "fixtures").mkdir(parents=True)
    with (task_dir / "fixtures" / "dump.bin").open("wb") as fh:
        fh.truncate(1 << 30)
    (task_dir / "task.yaml").write_text(
        "task_id: T01_big\ntask_name: big\nprompt:\n  text: Read fixtures/dump.bin.\n"
        "sandbox_files: [fixtures/dump.bin]\n")
    with pytest.raises(Exception, match=r"sandbox file fixtures/dump.bin: T01_big/fixtures/dump.bin is 1024 MB, over the 64 MB"):
        convert_task(tmp_path / "claw", task_dir)
