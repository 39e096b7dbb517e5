"""A task's setup files as bytes: text in `files`, anything else in `binary_files`, byte-exact on every backend.

A task record names its setup files in two fields, both path -> content, both written into the sandbox's
working directory before the agent starts (each backend's `write_file` takes bytes):

    files          UTF-8 text, as it is
    binary_files   any bytes (an image, a PDF, a SQLite database), base64 (RFC 4648, padded); decoded strictly

In a task folder neither field needs writing by hand: every file under `files/` is a setup file, read as
bytes, and one that is not UTF-8 becomes a `binary_files` entry. That folder is the form an importer
writes (`write_binary_files`): inside task.json a PDF would be base64, a third larger and unreadable;
beside it, it is the file itself, and the task.json stays small enough to read. JSONL sets (one line a
task) and the store's task records carry the base64 field.

Every loader and importer reads a task folder's files through `read_task_file` and `task_tree` (issue 43):
a link that leads out of the task folder is refused, never followed (a `files/leak.txt` linked to
/etc/shadow would put the host's file in every sandbox), and so is a file past `SetupLimits` (tasks.
max_setup_file_mb, tasks.max_setup_files), judged by its size and the folder's count before anything is read.
"""

from __future__ import annotations

import base64
import binascii
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from openforge.rollouts.tasks.grading import check_relative_paths

if TYPE_CHECKING:
    from openforge.config import TasksConfig

FILES_DIR = "files"  # a task folder's setup files, text and binary (rollouts/tasks/format.py)


@dataclass(frozen=True)
class SetupLimits:
    """What one task's folder may hold: each file at most `max_file_bytes`, each folder of files (files/, a
    Harbor task's tests/ or environment/) at most `max_files` (the config's tasks section sets them)."""

    max_file_bytes: int = 64 << 20
    max_files: int = 5000

    @classmethod
    def of(cls, config: "TasksConfig") -> "SetupLimits":
        return cls(int(config.max_setup_file_mb * (1 << 20)), config.max_setup_files)


def _shown(path: Path, folder: Path) -> str:
    return f"{folder.name}/{path.relative_to(folder).as_posix()}" if path.is_relative_to(folder) else str(path)


def check_inside(path: Path, folder: Path) -> None:
    """ValueError, one line, when `path` (every link on its way followed) leads out of the task `folder`."""
    real, home = Path(os.path.realpath(path)), Path(os.path.realpath(folder))
    if real != home and not real.is_relative_to(home):
        raise ValueError(f"{_shown(path, folder)} is a link out of the task folder (to {real}): refused")


def read_task_file(path: Path, folder: Path, limits: SetupLimits = SetupLimits()) -> bytes:
    """The bytes of one file of the task `folder`; ValueError, one line, for a link out of it, something
    other than a regular file, or a file larger than the limit (judged by its size: nothing is read)."""
    check_inside(path, folder)
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{_shown(path, folder)} is not a regular file")
        if st.st_size > limits.max_file_bytes:
            raise ValueError(f"{_shown(path, folder)} is {st.st_size / (1 << 20):.0f} MB, over the "
                             f"{limits.max_file_bytes / (1 << 20):g} MB a task file may be (tasks.max_setup_file_mb)")
        with path.open("rb") as fh:
            data = fh.read(limits.max_file_bytes + 1)  # it may have grown since
    except OSError as exc:
        raise ValueError(f"{_shown(path, folder)}: cannot read: {exc.strerror or exc}") from None
    if len(data) > limits.max_file_bytes:
        raise ValueError(f"{_shown(path, folder)} grew past {limits.max_file_bytes / (1 << 20):g} MB while read")
    return data


def task_tree(root: Path, folder: Path, limits: SetupLimits = SetupLimits()) -> list[Path]:
    """Every file under `root` (a folder of the task `folder`), sorted, to be read with `read_task_file`;
    ValueError, one line, when there are more than the limit (counted, nothing read) or a link to a folder
    leads out of `folder`."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):  # a link to a folder is never entered
        base = Path(dirpath)
        for name in dirnames:
            if (base / name).is_symlink():
                check_inside(base / name, folder)
        found += [base / n for n in filenames]
        if len(found) > limits.max_files:
            raise ValueError(f"{_shown(root, folder)} holds more than {limits.max_files} files "
                             "(tasks.max_setup_files)")
    return sorted(found)


def decode(content: str, path: str) -> bytes:
    """One `binary_files` entry's bytes; ValueError (for a pydantic validator) naming the path unless it is
    base64 with only its own alphabet and the right padding (a stray character is never silently dropped)."""
    try:
        return base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"{path!r} is not base64 ({exc})") from None


def encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def read_tree(root: Path, *, binary: bool, limits: SetupLimits = SetupLimits(),
              ) -> tuple[dict[str, str], dict[str, str], list[tuple[Path, str]]]:
    """(text files, binary files as base64, unreadable files with why) under `root` (a folder of the task
    folder `root.parent`), by path relative to it.

    Read as bytes: a text file keeps its bytes (a CRLF stays a CRLF). With `binary` False a file that is
    not UTF-8 is an error, for the folders whose files the format keeps as text (a task's `verifier/`)."""
    text: dict[str, str] = {}
    raw: dict[str, str] = {}
    errors: list[tuple[Path, str]] = []
    try:
        files = task_tree(root, root.parent, limits)
    except ValueError as exc:
        return text, raw, [(root, str(exc))]
    for f in files:
        rel = f.relative_to(root).as_posix()
        try:
            data = read_task_file(f, root.parent, limits)
        except ValueError as exc:
            errors.append((f, str(exc)))
            continue
        try:
            text[rel] = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            if binary:
                raw[rel] = encode(data)
            else:
                errors.append((f, f"{root.name} files must be UTF-8 text: {exc}"))
    return text, raw, errors


def write_binary_files(folder: Path, binary_files: dict[str, str]) -> None:
    """A task folder's `files/` as an importer writes it: exactly the binary setup files given, each at its
    path (the importer owns the folder: a re-import replaces what an earlier one left there)."""
    check_relative_paths(binary_files, str(folder / FILES_DIR))
    target = folder / FILES_DIR
    if target.exists():
        shutil.rmtree(target)
    for path, content in binary_files.items():
        (target / path).parent.mkdir(parents=True, exist_ok=True)
        (target / path).write_bytes(decode(content, path))
