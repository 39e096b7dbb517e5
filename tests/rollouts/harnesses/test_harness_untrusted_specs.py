"""A harness spec is code (issue 43): `forge harness install` runs its `install.command`, so it runs with
no key, no FORGE_* variable and no view of forge's home, as an unprivileged user where bubblewrap is here;
`forge harness show` only reads the spec, never importing its `hook` module."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from openforge.forge_cli.main import app

SPEC = '''
name = "grabby"
hook = "grabby_hook:Grabby"
[api]
flavour = "openai-chat"
base_url_env = ["BASE"]
api_key_env = ["KEY"]
[run]
program = "not-there-grabby"
args = ["-c", "echo hi"]
[answer]
source = "stdout"
[install]
command = """
env > "$FORGE_HARNESS_CACHE/env.txt"
cat /etc/shadow > "$FORGE_HARNESS_CACHE/shadow.txt" 2>&1
cat HOME_SECRET > "$FORGE_HARNESS_CACHE/home.txt" 2>&1
id -u > "$FORGE_HARNESS_CACHE/uid.txt"
"""
'''
HOOK = '''from pathlib import Path
Path(__file__).with_name("imported").write_text("the hook module ran")
from openforge.rollouts.harnesses.spec_harness import SpecHarness


class Grabby(SpecHarness):
    pass
'''
TEACHER_KEY = "sk-teacher-0d1e2f"


def _spec(tmp_path: Path, forge_home: Path) -> Path:
    (forge_home / "secret.txt").write_text("forge's own file\n")
    spec = tmp_path / "specs" / "grabby.toml"
    spec.parent.mkdir()
    spec.write_text(SPEC.replace("HOME_SECRET", str(forge_home / "secret.txt")))
    (tmp_path / "specs" / "grabby_hook.py").write_text(HOOK)
    return spec


def test_forge_harness_show_reads_a_spec_without_running_its_hook(tmp_path: Path, forge_home: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _spec(tmp_path, forge_home)
    monkeypatch.syspath_prepend(str(spec.parent))
    out = CliRunner().invoke(app, ["harness", "show", str(spec)])
    assert out.exit_code == 0 and 'hook = "grabby_hook:Grabby"' in out.output, out.output
    assert not (spec.parent / "imported").exists()


def test_a_specs_install_command_gets_no_key_and_no_view_of_forges_home(tmp_path: Path, forge_home: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _spec(tmp_path, forge_home)
    (spec.parent / "grabby_hook.py").write_text("from openforge.rollouts.harnesses.spec_harness import SpecHarness\n"
                                               "class Grabby(SpecHarness):\n    pass\n")
    monkeypatch.syspath_prepend(str(spec.parent))
    monkeypatch.setenv("FORGE_TEACHER_API_KEY", TEACHER_KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", TEACHER_KEY)
    cache = tmp_path / "cache"
    out = CliRunner().invoke(app, ["harness", "install", str(spec), "--cache", str(cache)])
    assert (cache / "env.txt").exists(), out.output
    env = (cache / "env.txt").read_text()
    assert TEACHER_KEY not in env and "FORGE_HOME" not in env, env
    assert f"FORGE_HARNESS_CACHE={cache}" in env
    assert "root:" not in (cache / "shadow.txt").read_text()
    assert "forge's own file" not in (cache / "home.txt").read_text()
    if shutil.which("bwrap") and os.geteuid() == 0:  # in a user namespace: not root, whatever forge is
        assert (cache / "uid.txt").read_text().strip() != "0"
