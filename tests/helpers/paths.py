"""Where things are, for tests at any depth under tests/ (a test file's own `Path(__file__)` changes
meaning when it moves between folders; these do not)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
DATA = TESTS / "data"  # task sets and recordings in their real formats (not our tests: norecursedirs)
