"""Shared fixtures. Every test gets its own FORGE_HOME in a temp dir."""

from __future__ import annotations

from pathlib import Path

import pytest

from openforge.store import Store
from tests.helpers.required import KNOWN_REQUIREMENTS, UnknownRequirement, required, skip_or_fail


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"requires(name, missing): needs one of {', '.join(KNOWN_REQUIREMENTS)}; "
                                       "skips when `missing` is a reason, fails instead when FORGE_REQUIRE names it")
    try:
        required()
    except UnknownRequirement as exc:  # a typo in FORGE_REQUIRE must not quietly require nothing
        raise pytest.UsageError(str(exc)) from exc


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("requires"):
        name, missing = mark.args
        if missing is not None:
            skip_or_fail(name, missing)


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
