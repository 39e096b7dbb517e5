"""openforge/paths.py: one data dir (an override, else $FORGE_HOME, else ~/.forge), and where a run's
artefacts and the models live under it."""

from __future__ import annotations

from pathlib import Path

import pytest

from openforge.paths import db_path, default_tiny_model, forge_home, runs_dir, store_home


def test_the_override_wins_over_the_environment_which_wins_over_home(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORGE_HOME", str(tmp_path / "from-env"))
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert forge_home(tmp_path / "given" / "deeper") == tmp_path / "given" / "deeper"
    assert (tmp_path / "given" / "deeper").is_dir()  # made when missing
    assert forge_home() == tmp_path / "from-env"
    monkeypatch.delenv("FORGE_HOME")
    assert forge_home() == tmp_path / "user" / ".forge"
    assert forge_home("~/elsewhere") == tmp_path / "user" / "elsewhere"  # ~ is the user's, resolved


def test_a_stores_artefacts_sit_beside_its_file_or_in_forge_home_for_a_url(forge_home: Path, tmp_path: Path) -> None:
    home = tmp_path / "h"
    assert store_home(db_path(home)) == home
    assert store_home("postgresql://forge@db/forge") == forge_home
    assert runs_dir(home) == home / "runs" and default_tiny_model(home) == home / "models" / "tiny"
