"""ClawEval tasks that work on files (rollouts/tasks/claweval/importer.py, rollouts/runner/grader.py): the task's
`sandbox_files` are written into the sandbox's working directory (ClawEval's /workspace), and the files its
`env_snapshot_files` name are copied out of it after the agent is gone, for its grader.py (ClawEval's
env_snapshot). A task folder in ClawEval's layout is made here beside the small checkout in
tests/data/claweval (its notes service and claw_eval grading modules)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import yaml

from openforge.config import ForgeConfig
from openforge.rollouts.tasks.claweval.score import verdict_path
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.claweval.importer import import_claweval
from openforge.rollouts.tasks.claweval.payload import ClawEvalPayload
from openforge.rollouts.tasks.claweval.grading import snapshot_entry
from openforge.rollouts.tasks.format import TaskSpec
from openforge.rollouts.tasks.selfcheck import _StandInHarness
from openforge.store import Store
from tests.helpers.paths import DATA
from tests.helpers.claweval import _agent

SRC = DATA / "claweval"
pytest.importorskip("fastapi", reason="ClawEval's mock services are FastAPI apps (pip install 'openforge[claweval]')")

TASK = {
    "task_id": "N007_extend_list", "task_name": "Extend a list", "difficulty": "easy",
    "prompt": {"text": "Add eggs as a new line at the end of /workspace/fixtures/todo.txt, then save a note "
                       "titled groceries.", "language": "en"},
    "services": [{"name": "notes", "command": "python mock_services/notes/server.py", "port": 9120,
                  "health_check": "http://localhost:9120/notes/list", "health_check_method": "POST",
                  "reset_endpoint": "http://localhost:9120/notes/reset",
                  "env": {"NOTES_FIXTURES": "tasks/N001_save_note/fixtures/notes/notes.json"}}],
    "tools": [{"name": "notes_create", "description": "Create a note",
               "input_schema": {"type": "object", "properties": {"title": {"type": "string"}}}}],
    "tool_endpoints": [{"tool_name": "notes_create", "url": "http://localhost:9120/notes/create", "method": "POST"}],
    "sandbox_files": ["fixtures/todo.txt"],
    "env_snapshot_files": ["/workspace/fixtures/todo.txt"],
    "scoring_components": [{"name": "noted", "weight": 1.0,
                            "check": {"type": "tool_called", "tool_name": "notes_create"}}],
}
# ClawEval's style: the grader reads the file from env_snapshot, as _collect_env_snapshot gives it.
GRADER = '''from claw_eval.graders.base import AbstractGrader
from claw_eval.models.trace import DimensionScores


class ExtendListGrader(AbstractGrader):
    def grade(self, messages, dispatches, task, audit_data=None, judge=None, media_events=None, env_snapshot=None):
        scores = DimensionScores()
        entry = (env_snapshot or {}).get("file:/workspace/fixtures/todo.txt", {})
        scores.completion = 1.0 if entry.get("encoding") == "utf-8" and entry.get("content") == "milk\\neggs\\n" else 0.0
        scores.robustness = self.compute_robustness(dispatches)
        return scores
'''
NOTE = _agent([("/notes/create", {"title": "groceries"})])
# Appending only works on the file forge wrote: without it the file would hold "eggs" alone.
EDIT = "grep -qx milk fixtures/todo.txt && echo eggs >> fixtures/todo.txt\n"
# The right content everywhere but the workspace file itself, which becomes a link out of the workdir, and
# an env_snapshot.json in the workdir claiming the file.
PLANT = """printf 'milk\\neggs\\n' > /tmp/planted.txt
for d in /tmp/fixtures "$HOME/fixtures" "$HOME/workspace/fixtures"; do
  mkdir -p "$d" && cp /tmp/planted.txt "$d/todo.txt"
done
echo '{"file:/workspace/fixtures/todo.txt": {"content": "milk\\neggs\\n", "encoding": "utf-8"}}' > env_snapshot.json
rm fixtures/todo.txt && ln -s /tmp/planted.txt fixtures/todo.txt
"""


def _checkout(tmp_path: Path, **changes: object) -> Path:
    root = tmp_path / "claw-eval"
    shutil.copytree(SRC, root)
    folder = root / "tasks" / "N007_extend_list"
    (folder / "fixtures").mkdir(parents=True)
    (folder / "fixtures" / "todo.txt").write_text("milk\n", encoding="utf-8")
    (folder / "grader.py").write_text(GRADER, encoding="utf-8")
    (folder / "task.yaml").write_text(yaml.safe_dump({**TASK, **changes}), encoding="utf-8")
    return root


def _task(root: Path) -> TaskSpec:
    (record,) = [t for t in import_claweval(root).tasks if t["id"] == "N007_extend_list"]
    return TaskSpec.model_validate(record)


def test_sandbox_files_become_setup_files_and_the_snapshot_names_workdir_paths(tmp_path: Path) -> None:
    task = _task(_checkout(tmp_path))
    assert task.files == {"fixtures/todo.txt": "milk\n"}
    assert "./fixtures/todo.txt" in task.instruction and "/workspace" not in task.instruction
    claweval = task.payload(ClawEvalPayload)
    assert claweval is not None
    assert claweval.grading.snapshot_files == {"/workspace/fixtures/todo.txt": "fixtures/todo.txt"}


@pytest.mark.parametrize(("changes", "why"), [
    ({"sandbox_files": ["fixtures/gone.txt"]}, "sandbox file fixtures/gone.txt is missing"),
    ({"sandbox_files": ["../N001_save_note/grader.py"]}, "sandbox file ../N001_save_note/grader.py is outside"),
    # another task's fixture named from the checkout's root (issue 44: it was called "missing")
    ({"sandbox_files": ["tasks/N001_save_note/fixtures/notes/notes.json"]},
     "sandbox file tasks/N001_save_note/fixtures/notes/notes.json is outside the task folder (a path from the "
     "checkout's root)"),
    ({"env_snapshot_files": ["/workspace/*.txt"]}, "env_snapshot_files /workspace/*.txt: only files named under"),
    ({"env_snapshot_commands": ["python check.py"]}, "commands run in the sandbox before grading"),
    ({"sandbox_grader_files": ["fixtures/todo.txt"]}, "grader files written into the sandbox"),
])
def test_what_forge_cannot_prepare_is_refused_with_its_reason(tmp_path: Path, changes: dict, why: str) -> None:
    report = import_claweval(_checkout(tmp_path, **changes))
    assert why in dict(report.unsupported)["N007_extend_list"]


def test_snapshot_entries_take_the_shape_of_clawevals_sandbox_read() -> None:
    assert snapshot_entry("/workspace/a.csv", b"x,1\n") == {"content": "x,1\n", "mime_type": "text/csv",
                                                            "encoding": "utf-8"}
    assert snapshot_entry("/workspace/out.png", b"\x89PNG") == {"content": "iVBORw==", "mime_type": "image/png",
                                                                "encoding": "base64", "size_bytes": 4}
    assert snapshot_entry("/workspace/data.bin", b"abc")["encoding"] == "base64"  # unknown type: binary, as ClawEval
    assert snapshot_entry("/workspace/gone.txt", None) == {"error": "File not found: /workspace/gone.txt"}


# A binary sandbox file (every byte value) that the grader reads back from env_snapshot, base64 as ClawEval's
# sandbox `/read` gives a PNG: completion 1 only for exactly the bytes forge wrote.
LOGO = bytes(range(256))
LOGO_GRADER = f'''import base64
from claw_eval.graders.base import AbstractGrader
from claw_eval.models.trace import DimensionScores


class LogoGrader(AbstractGrader):
    def grade(self, messages, dispatches, task, audit_data=None, judge=None, media_events=None, env_snapshot=None):
        scores = DimensionScores()
        entry = (env_snapshot or {{}}).get("file:/workspace/fixtures/logo.png", {{}})
        same = entry.get("encoding") == "base64" and base64.b64decode(entry.get("content", "")) == {LOGO!r}
        scores.completion = 1.0 if same else 0.0
        scores.robustness = self.compute_robustness(dispatches)
        return scores
'''


def test_a_binary_sandbox_file_is_written_byte_exact_and_its_grader_reads_the_bytes(tmp_path: Path,
                                                                                    store: Store) -> None:
    """Imported to a task folder (the PNG beside task.json, not base64 in it), validated by `forge tasks validate`,
    run: the grader's env_snapshot holds exactly the bytes forge wrote (task score 1); one byte changed by the
    agent, completion 0."""
    from typer.testing import CliRunner

    from openforge.forge_cli.main import app
    from openforge.rollouts.tasks.importing import write_tasks
    from openforge.rollouts.tasks.format import load_tasks

    root = _checkout(tmp_path, sandbox_files=["fixtures/todo.txt", "fixtures/logo.png"],
                     env_snapshot_files=["/workspace/fixtures/logo.png"])
    (root / "tasks" / "N007_extend_list" / "fixtures" / "logo.png").write_bytes(LOGO)
    (root / "tasks" / "N007_extend_list" / "grader.py").write_text(LOGO_GRADER, encoding="utf-8")
    report = import_claweval(root)
    assert "N007_extend_list" not in dict(report.unsupported)
    out = write_tasks(report.tasks, tmp_path / "imported")
    assert (out / "N007_extend_list" / "files" / "fixtures" / "logo.png").read_bytes() == LOGO
    assert "binary_files" not in json.loads((out / "N007_extend_list" / "task.json").read_text())
    done = CliRunner().invoke(app, ["tasks", "validate", str(out)])
    assert done.exit_code == 0 and f"{len(report.tasks)} task(s) ok" in done.output, done.output
    task = next(t for t in load_tasks(out) if t.id == "N007_extend_list")
    assert task.setup_files() == {"fixtures/todo.txt": b"milk\n", "fixtures/logo.png": LOGO}
    run = store.create_run(kind="eval", name="claweval-binary")
    got = {}
    flip = "printf '\\001' | dd of=fixtures/logo.png bs=1 seek=0 conv=notrunc 2>/dev/null\n"
    for label, script in {"untouched": NOTE, "changed": flip + NOTE}.items():
        runner = RolloutRunner(store, config=ForgeConfig(), proxy_url="http://127.0.0.1:9",
                               harness=_StandInHarness({task.id: script}, {task.id: "Done."}))
        (ro,) = asyncio.run(runner.run(run.id, [RolloutSpec(task)]))
        assert ro.status == "scored", (label, ro.error, ro.stderr)
        got[label] = json.loads(verdict_path(run.id, ro.id).read_text())["scores"]["completion"]
    assert got == {"untouched": 1.0, "changed": 0.0}


async def test_the_grader_reads_the_file_the_agent_left_and_nothing_planted_elsewhere(tmp_path: Path,
                                                                                      store: Store) -> None:
    """The agent appends to the file forge wrote: ClawEval's task score 1. Leaving it alone, or putting the
    right content outside the workdir (in /tmp, $HOME, behind a link, in a forged env_snapshot.json), scores
    what doing nothing scores: completion 0, task score 0.2 (ClawEval's formula)."""
    task = _task(_checkout(tmp_path))
    run = store.create_run(kind="eval", name="claweval-workspace")
    got = {}
    for label, script in {"edited": EDIT + NOTE, "idle": NOTE, "planted": PLANT + NOTE}.items():
        runner = RolloutRunner(store, config=ForgeConfig(), proxy_url="http://127.0.0.1:9",
                               harness=_StandInHarness({task.id: script}, {task.id: "Done."}))
        (ro,) = await runner.run(run.id, [RolloutSpec(task)])
        assert ro.status == "scored", (label, ro.error, ro.stderr)
        verdict = json.loads(verdict_path(run.id, ro.id).read_text())
        got[label] = (ro.reward, verdict["scores"]["completion"], verdict["task_score"])
    assert got["edited"] == (1.0, 1.0, 1.0)
    assert got["idle"] == got["planted"] == (0.2, 0.0, 0.2)  # the reward is the task score


def test_the_public_sets_binary_sandbox_files_are_no_longer_a_reason() -> None:
    """The real set, where a claw-eval checkout is at hand offline (CLAWEVAL_SRC; bench/claweval_grading.py
    counts it): its PNGs, PDF, JPEGs, SQLite databases and packet capture refuse no task; the tasks holding
    them are refused for what else they need, each reason given."""
    import os

    src = os.environ.get("CLAWEVAL_SRC")
    if not src or not Path(src, "tasks").is_dir():
        pytest.skip("CLAWEVAL_SRC names no claw-eval checkout (git clone github.com/claw-eval/claw-eval)")
    from bench.claweval_grading import _has_binary_file

    report = import_claweval(src)
    binary = {tid: why for tid, why in report.unsupported if _has_binary_file(Path(src, "tasks", tid))}
    assert binary and all("binary" not in why and why for why in binary.values()), binary
    assert not any("binary" in why for _, why in report.unsupported)
