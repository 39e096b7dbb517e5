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
"""

from __future__ import annotations

import base64
import binascii
import shutil
from pathlib import Path

from openforge.rollouts.tasks.grading import check_relative_paths

FILES_DIR = "files"  # a task folder's setup files, text and binary (rollouts/tasks/format.py)


def decode(content: str, path: str) -> bytes:
    """One `binary_files` entry's bytes; ValueError (for a pydantic validator) naming the path unless it is
    base64 with only its own alphabet and the right padding (a stray character is never silently dropped)."""
    try:
        return base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"{path!r} is not base64 ({exc})") from None


def encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def read_tree(root: Path, *, binary: bool) -> tuple[dict[str, str], dict[str, str], list[tuple[Path, str]]]:
    """(text files, binary files as base64, unreadable files with why) under `root`, by path relative to it.

    Read as bytes: a text file keeps its bytes (a CRLF stays a CRLF). With `binary` False a file that is
    not UTF-8 is an error, for the folders whose files the format keeps as text (a task's `verifier/`)."""
    text: dict[str, str] = {}
    raw: dict[str, str] = {}
    errors: list[tuple[Path, str]] = []
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = f.relative_to(root).as_posix()
        try:
            data = f.read_bytes()
        except OSError as exc:
            errors.append((f, f"cannot read: {exc.strerror or exc}"))
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
