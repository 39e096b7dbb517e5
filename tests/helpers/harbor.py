"""Harbor-format task folders written here (one whose verifier runs pytest, one plain)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from openforge.forge_cli.main import app


def _task(root: Path, name: str, *, toml: str = "", dockerfile: str = "FROM ubuntu:24.04\nWORKDIR /app\n",
          test_sh: str | None = None, instruction: str = "Do it.") -> Path:
    """A Harbor task folder in the real layout."""
    folder = root / name
    (folder / "environment").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "task.toml").write_text('version = "1.0"\n' + textwrap.dedent(toml))
    (folder / "instruction.md").write_text(instruction)
    (folder / "environment" / "Dockerfile").write_text(dockerfile)
    if test_sh is not None:
        (folder / "tests" / "test.sh").write_text("#!/bin/bash\n" + textwrap.dedent(test_sh))
    return folder


def _pytest_task(root: Path, name: str = "answer", runner: str = "") -> Path:
    """A task whose test.sh runs pytest on /tests from the WORKDIR, as Terminal-Bench's do (`uvx pytest`: the
    console script; `runner` replaces it)."""
    folder = _task(root, name, test_sh=f"""
        cd /app
        export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1  # uvx's pytest has no plugins; this venv's take seconds to load
        {runner or Path(sys.executable).with_name("pytest")} -q /tests/test_outputs.py
        if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
        """, instruction="Write 42 into /app/answer.txt.")
    (folder / "tests" / "test_outputs.py").write_text(
        "from pathlib import Path\n\n\ndef test_answer():\n    assert Path('/app/answer.txt').read_text().strip() == '42'\n")
    (folder / "solution").mkdir()
    (folder / "solution" / "solve.sh").write_text("#!/bin/bash\necho 42 > /app/answer.txt\n")
    return folder
