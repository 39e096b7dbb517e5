"""`forge tasks import FORMAT SRC`: what a family's importer declares and returns (rollouts/tasks/kinds.py,
`import_tasks`), and the writers the shipped importers share.

A family names the formats it reads (`import_formats`), says what each source is (`import_help`,
`import_source`) and what `--out` becomes (`import_out`), and declares the options only it reads
(`import_options`: `--base`, `--cache`, ...). The CLI builds the command from those declarations and names
no family; it prints what the importer returns: each refused task and each note on stderr, then the summary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openforge.errors import TaskError
from openforge.rollouts.tasks.setup_files import write_binary_files


@dataclass(frozen=True)
class ImportOption:
    """An option of `forge tasks import` that one family's importer reads: `--<name with dashes>`, passed to
    its `import_tasks` as `options[name]` (the default when not given; a repeatable option: a list)."""

    name: str  # a Python name: "local_sites" is `--local-sites`
    help: str  # shown after the formats that read it: "harbor: FROM=IMAGE, ..."
    default: str | None = None
    repeatable: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass
class ImportResult:
    """What an import did: the tasks written where, each refused task with its reason, each imported task
    with a note, and the lines that say it (stdout). The CLI prints `refused`, then `notes`, as `WHERE: WHY`
    on stderr; nothing imported is exit 1 (the importer writes nothing then), else it prints `summary`."""

    tasks: list[dict[str, Any]]
    written_to: str
    refused: list[tuple[str, str]] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)
    summary: str = ""


def check_some_imported(src: str, result: ImportResult) -> None:
    """An import that converted nothing is a failure (exit 1), whatever it refused and why (listed above)."""
    if not result.tasks:
        raise TaskError(f"{src}: none of its {len(result.refused)} task(s) could be imported (the reasons are "
                        "above)" if result.refused else f"{src}: no tasks found")


def write_tasks(records: list[dict[str, Any]], out: str | Path) -> Path:
    """Each record as `OUT/<id>/task.json` (a forge task folder set; `forge tasks validate OUT`), its binary setup
    files beside it as the files themselves, `OUT/<id>/files/<path>`, not base64 in the JSON (setup_files.py)."""
    folder = Path(out).expanduser()
    for record in records:
        task = folder / record["id"]
        task.mkdir(parents=True, exist_ok=True)
        binary = record.get("binary_files") or {}
        write_binary_files(task, binary)
        record = {k: v for k, v in record.items() if k != "binary_files"}
        (task / "task.json").write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return folder


def write_jsonl(records: list[dict[str, Any]], out: str | Path) -> Path:
    """The records as one JSONL task file, one task a line. TaskError for a name the task loader would not
    read as one (it reads a .jsonl file as a task set, a folder as task folders)."""
    path = Path(out).expanduser()
    if path.suffix != ".jsonl":
        raise TaskError(f"--out {out}: this format is written as one task file: give it a .jsonl name")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in records), encoding="utf-8")
    return path
