"""Where OpenForge keeps its data: one folder, `~/.forge` unless `FORGE_HOME` or `--home` says otherwise."""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "FORGE_HOME"


def forge_home(override: str | Path | None = None) -> Path:
    """The data dir: `override` if given, else `$FORGE_HOME`, else `~/.forge`. Created if missing."""
    raw = override or os.environ.get(HOME_ENV) or Path.home() / ".forge"
    home = Path(raw).expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    return home


def db_path(home: Path) -> Path:
    return home / "forge.db"


def store_home(store_path: str | Path) -> Path:
    """The data dir a store's run artefacts (a call's images) live under: the folder of an SQLite file
    (`home/forge.db`), or `forge_home()` for a database URL. The proxy writes there, the runner reads."""
    return forge_home() if "://" in str(store_path) else Path(store_path).parent


def runs_dir(home: Path) -> Path:
    """Per-run artefacts (adapters, checkpoints, logs) live in `runs/<run id>/`."""
    return home / "runs"


def models_dir(home: Path) -> Path:
    return home / "models"


def default_tiny_model(home: Path) -> Path:
    return models_dir(home) / "tiny"


def default_tiny_vl_model(home: Path) -> Path:
    """The tiny VLM GUI harnesses get when no model is configured (warmed up for the GUI demo)."""
    return models_dir(home) / "tiny-vl-gui"
