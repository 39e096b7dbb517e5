"""`forge eval --adapter`: a folder or a run is checked before anything starts (runs/evaluate.py adapter_folder)."""

from __future__ import annotations

from pathlib import Path

import pytest

from openforge.config import ForgeConfig
from openforge.errors import ConfigError
from openforge.runs.evaluate import adapter_folder
from openforge.store import Store


def test_no_adapter_is_none_and_a_name_is_left_to_an_engine_forge_does_not_run(store: Store, forge_home: Path) -> None:
    config = ForgeConfig()
    assert adapter_folder(store, config, forge_home, None) is None
    remote = config.model_copy(update={"engine": config.engine.model_copy(update={"kind": "url", "url": "http://127.0.0.1:9"})})
    assert adapter_folder(store, remote, forge_home, "step-3") is None  # a name the running engine serves


def test_an_adapter_that_is_neither_a_folder_nor_a_run_is_one_line(store: Store, forge_home: Path) -> None:
    with pytest.raises(ConfigError, match=r"--adapter no-such: neither an adapter folder nor a run"):
        adapter_folder(store, ForgeConfig(), forge_home, "no-such")


def test_a_run_that_saved_no_adapter_is_named(store: Store, forge_home: Path) -> None:
    run = store.create_run(kind="eval", name="x", config={})
    with pytest.raises(ConfigError, match=rf"--adapter {run.id}: run {run.id} .* saved no LoRA adapter"):
        adapter_folder(store, ForgeConfig(), forge_home, run.id)


def test_a_folder_that_is_no_adapter_is_refused(store: Store, forge_home: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="--adapter|adapter"):
        adapter_folder(store, ForgeConfig(), forge_home, str(tmp_path / "empty"))
