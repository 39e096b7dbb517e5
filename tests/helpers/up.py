"""The end-to-end tests of forge up: the real CLI in a subprocess, a FORGE_HOME with the tiny model, and readers
of what a run served and stored."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from openforge.store import Store


FORGE = [sys.executable, "-m", "openforge.forge_cli.main"]


# One task, two samples a step: the smallest run that still has a GRPO group.
SMALL = ["--set", "runner.samples_per_task=2", "--set", "trainer.tasks_per_step=1", "--set", "runner.concurrency=2"]


def forge(home: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FORGE, *args], env={**os.environ, "FORGE_HOME": str(home)}, cwd=home,
                          capture_output=True, text=True, timeout=timeout)


def spawn(home: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*FORGE, *args], env={**os.environ, "FORGE_HOME": str(home)}, cwd=home,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture
def home_with_model(forge_home: Path, tiny_model: Path) -> Path:
    (forge_home / "models").mkdir()
    (forge_home / "models" / "tiny").symlink_to(tiny_model)
    return forge_home


def served_with_adapter(store: Store, run_id: str, step: int, adapter: str) -> list:
    """The calls of `step`'s rollouts that the engine answered with `adapter` (it refuses unknown ones)."""
    ids = {r.id for r in store.list_rollouts(run_id, step=step) if r.adapter == adapter}
    return [c for c in store.list_calls(run_id=run_id) if c.rollout_id in ids and c.adapter == adapter
            and c.status == "ok"]
