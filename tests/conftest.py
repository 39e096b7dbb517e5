"""Shared fixtures. Every test gets its own FORGE_HOME in a temp dir."""

from __future__ import annotations

from pathlib import Path

import pytest

from openforge.store import Store


@pytest.fixture(autouse=True)
def forge_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "forge-home"
    home.mkdir()
    monkeypatch.setenv("FORGE_HOME", str(home))
    return home


@pytest.fixture
def store(forge_home: Path) -> Store:
    s = Store(forge_home / "forge.db")
    yield s
    s.close()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2 model + tokenizer, built once per test session (read-only for tests)."""
    from openforge.engine.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model") / "tiny")


@pytest.fixture(scope="session")
def tiny_vl_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2-VL model + processor (engine/tiny_vl.py), built once per test session (read-only)."""
    from openforge.engine.tiny_vl import build_tiny_vl_model

    return build_tiny_vl_model(tmp_path_factory.mktemp("tiny-vl-model") / "tiny-vl")
