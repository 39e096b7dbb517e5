"""runs/checks.py: what `forge doctor` says of this machine, one verdict per item, each with the line that fixes
it. (`forge doctor` running them all is tests/forge_cli/test_cli.py's.)"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from openforge.config import ForgeConfig, SglangEngineConfig
from openforge.runs.checks import check_npm_harnesses, check_sglang, check_store


def test_the_store_check_names_the_sqlite_file_or_the_server_it_cannot_reach(tmp_path: Path) -> None:
    got = check_store(ForgeConfig(), tmp_path)
    assert (got.verdict, got.detail) == ("ok", f"SQLite file {tmp_path / 'forge.db'} (made by the first run)")
    (tmp_path / "forge.db").touch()
    assert check_store(ForgeConfig(), tmp_path).detail == f"SQLite file {tmp_path / 'forge.db'}"
    config = ForgeConfig.model_validate({"store": {"url": "postgresql://forge@127.0.0.1:1/forge"}})
    assert check_store(config, tmp_path).verdict == "missing"  # no server there (or no driver): never "ok"


def test_an_interpreter_without_sglang_is_named(tmp_path: Path) -> None:
    config = ForgeConfig()
    config.engine = SglangEngineConfig(sglang_python=sys.executable)
    got = check_sglang(config)
    assert got.verdict == "missing" and repr(sys.executable) in got.detail and "engine.sglang_python" in got.detail


@pytest.mark.skipif(not (shutil.which("node") and shutil.which("npm")), reason="node and npm not installed")
def test_each_npm_harness_is_found_in_the_cache_or_its_install_command_is_said(tmp_path: Path) -> None:
    cache = tmp_path / "npm"
    (cache / "node_modules" / ".bin").mkdir(parents=True)
    (cache / "node_modules" / ".bin" / "claude").write_text("#!/bin/sh\n")
    config = ForgeConfig.model_validate({"harness": {"npm_cache": str(cache)}})
    got = {c.name: c for c in check_npm_harnesses(config, tmp_path)}
    assert got["node/npm"].verdict == "ok" and got["node/npm"].detail.startswith("node v")
    assert (got["harness claude-code"].verdict, got["harness claude-code"].detail) == \
        ("ok", str(cache / "node_modules" / ".bin" / "claude"))
    if not shutil.which("codex"):
        assert got["harness codex"].verdict == "warn" and "forge harness install codex" in got["harness codex"].detail

