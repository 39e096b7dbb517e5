"""Binary setup files (rollouts/tasks/setup_files.py): `binary_files` (base64) in a task record, any file under
a task folder's `files/`, written byte-exact into the sandbox by the runner on every backend; and the one-line
messages `forge tasks validate` gives for bad base64, a path out of the working directory, a path both text
and binary."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from openforge.config import ForgeConfig
from openforge.forge_cli.main import app
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import TaskSpec, load_tasks, validate_tasks
from openforge.rollouts.tasks.selfcheck import _StandInHarness
from openforge.sandbox.testing import backend_config, sandbox_backends
from openforge.store import Store
from tests.helpers.required import skip_or_fail

pytestmark = pytest.mark.timeout(180)
ALL_BYTES = bytes(range(256))
# The verifier proves the bytes in the sandbox: every byte value once, in order, nothing added or lost.
VERIFIER = f'[ "$(sha256sum data/all.bin | cut -d" " -f1)" = {hashlib.sha256(ALL_BYTES).hexdigest()} ]'


def _folder_task(root: Path) -> Path:
    """A task folder whose files/ holds a binary file and a CRLF text file (kept CRLF: bytes as they are), in a
    set folder of its own under `root` (tmp_path also holds the test's FORGE_HOME)."""
    root = root / "tasks"
    task = root / "binary-setup"
    (task / "files" / "data").mkdir(parents=True)
    (task / "files" / "data" / "all.bin").write_bytes(ALL_BYTES)
    (task / "files" / "notes.txt").write_bytes(b"one\r\ntwo\r\n")
    (task / "task.json").write_text(json.dumps({"instruction": "Look at data/all.bin.", "verifier": VERIFIER}))
    return root


def test_a_task_folder_keeps_binary_and_text_setup_files_byte_exact(tmp_path: Path) -> None:
    (task,) = load_tasks(_folder_task(tmp_path))
    assert task.files == {"notes.txt": "one\r\ntwo\r\n"}
    assert task.binary_files == {"data/all.bin": base64.b64encode(ALL_BYTES).decode()}
    assert task.setup_files() == {"notes.txt": b"one\r\ntwo\r\n", "data/all.bin": ALL_BYTES}
    # The record form (JSONL, the store) carries the base64 field and loads back to the same task.
    assert TaskSpec.model_validate(task.to_record()) == task


@pytest.mark.parametrize("backend", sandbox_backends())
def test_binary_setup_files_arrive_byte_exact_in_every_sandbox(backend: str, tmp_path: Path, store: Store) -> None:
    sandbox, why = backend_config(backend)
    if sandbox is None:
        skip_or_fail(backend, why)
    (task,) = load_tasks(_folder_task(tmp_path))
    got = {}
    # The agent leaves the file alone (it passes), or rewrites one byte of it (the same verifier fails it).
    for label, script in {"untouched": "true", "changed": "printf '\\377' | dd of=data/all.bin bs=1 seek=0 "
                                                           "conv=notrunc 2>/dev/null"}.items():
        run = store.create_run(kind="eval", name=f"binary-{label}")
        runner = RolloutRunner(store, config=ForgeConfig(sandbox=sandbox), proxy_url="http://127.0.0.1:9",
                               harness=_StandInHarness({task.id: script}, {task.id: "Done."}))
        (ro,) = asyncio.run(runner.run(run.id, [RolloutSpec(task)]))
        assert ro.status == "scored", (label, ro.error, ro.stderr)
        got[label] = ro.reward
    assert got == {"untouched": 1.0, "changed": 0.0}


def test_binary_setup_files_arrive_byte_exact_in_a_pod(tmp_path: Path, store: Store) -> None:
    """The Kubernetes backend against the API double (tests/k8s_double): the setup files go in by tar over
    the exec WebSocket's stdin."""
    from tests.k8s_double import KubeDouble, bwrap_available
    from tests.helpers.kubernetes import make_config

    if not bwrap_available():
        pytest.skip("the API double runs pods under bubblewrap and nsenter as root")
    (task,) = load_tasks(_folder_task(tmp_path))
    double = KubeDouble(tmp_path / "pods")
    double.start()
    try:
        cfg = ForgeConfig(sandbox=make_config(double, tmp_path))
        run = store.create_run(kind="eval", name="binary-pod")
        runner = RolloutRunner(store, config=cfg, proxy_url="http://127.0.0.1:9",
                               harness=_StandInHarness({task.id: "true"}, {task.id: "Done."}))
        (ro,) = asyncio.run(runner.run(run.id, [RolloutSpec(task)]))
    finally:
        double.stop()
    assert (ro.status, ro.reward) == ("scored", 1.0), (ro.error, ro.stderr)


def test_bad_binary_files_are_one_line_each_per_task(tmp_path: Path) -> None:
    good = base64.b64encode(b"\x00\xff").decode()
    rows = [{"id": "not-base64", "binary_files": {"a.bin": "not base64!"}},
            {"id": "bad-padding", "binary_files": {"a.bin": "AAE"}},
            {"id": "escapes", "binary_files": {"../a.bin": good}},
            {"id": "absolute", "binary_files": {"/etc/a.bin": good}},
            {"id": "both", "files": {"a.bin": "text"}, "binary_files": {"a.bin": good}},
            {"id": "fine", "binary_files": {"a.bin": good}}]
    path = tmp_path / "set.jsonl"
    path.write_text("\n".join(json.dumps({"instruction": "x", "verifier": "true", **r}) for r in rows) + "\n")
    problems = validate_tasks(path)
    # Python's own reason follows in brackets (its wording differs across versions).
    assert [(p.task_id, p.message.split(" (")[0]) for p in problems] == [
        ("not-base64", "binary_files: 'a.bin' is not base64"),
        ("bad-padding", "binary_files: 'a.bin' is not base64"),
        ("escapes", "binary_files: file path '../a.bin' must be relative and stay inside the working directory"),
        ("absolute", "binary_files: file path '/etc/a.bin' must be relative and stay inside the working directory"),
        ("both", "binary_files: a.bin also in files")]
    out = CliRunner().invoke(app, ["tasks", "validate", str(path)])
    assert out.exit_code == 1 and "Traceback" not in out.output
    lines = out.output.strip().splitlines()
    assert len(lines) == 6 and lines[-1] == f"forge: error: 5 problem(s) in {path}"
    assert lines[0].startswith(f"{path}:1 [not-base64]: binary_files: 'a.bin' is not base64 (")
    assert "padding" in problems[1].message


def test_a_binary_verifier_file_is_refused_with_its_path(tmp_path: Path) -> None:
    root = _folder_task(tmp_path)
    (root / "binary-setup" / "verifier").mkdir()
    (root / "binary-setup" / "verifier" / "check.bin").write_bytes(b"\xff\xfe")
    (problem,) = validate_tasks(root)
    assert problem.where.endswith("verifier/check.bin")
    assert problem.message.startswith("verifier files must be UTF-8 text: 'utf-8' codec can't decode byte 0xff")


def test_an_import_writes_binary_files_beside_task_json_and_replaces_what_it_left(tmp_path: Path) -> None:
    from openforge.rollouts.tasks.importing import write_tasks

    record = {"id": "img", "instruction": "x", "verifier": "true", "files": {"a.txt": "a\n"},
              "binary_files": {"pics/new.png": base64.b64encode(ALL_BYTES).decode()}}
    out = tmp_path / "out"
    (out / "img" / "files" / "pics").mkdir(parents=True)
    (out / "img" / "files" / "pics" / "old.png").write_bytes(b"\x89PNG stale")  # an earlier import's
    write_tasks([record], out)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "img/files/pics/new.png", "img/task.json"]
    assert json.loads((out / "img" / "task.json").read_text())["files"] == {"a.txt": "a\n"}
    (task,) = load_tasks(out)
    assert task.setup_files() == {"a.txt": b"a\n", "pics/new.png": ALL_BYTES}
