"""sandbox/confine.py: a task's own processes on the host (its MCP servers, services, tool commands) get no more
reach than the agent: bubblewrap with the task's folder as their only writable place, and an environment with
nothing of forge's but PATH; plain processes only where the run chose `sandbox.isolation = "none"`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from openforge.config import LocalSandboxConfig
from openforge.sandbox.confine import FOLDER_INSIDE, Confinement, ConfinementUnavailable, base_env
from openforge.sandbox.local import bwrap_usable


def test_unconfined_only_where_the_run_chose_it_and_still_with_a_scrubbed_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORGE_TEACHER_API_KEY", "sk-teacher")
    plain = Confinement.for_sandbox(LocalSandboxConfig(isolation="none"))
    assert not plain.confined
    argv, env = plain.command(["python3", "server.py"], str(tmp_path), env={"PORT": "8080"})
    assert argv == ["python3", "server.py"] and plain.inside(str(tmp_path)) == str(tmp_path)
    assert env == base_env(str(tmp_path), {"PORT": "8080"}) and set(env) == {"PATH", "LANG", "HOME", "TMPDIR", "PORT"}


def test_without_bubblewrap_a_run_that_asked_for_isolation_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import openforge.sandbox.confine as confine

    monkeypatch.setattr(confine, "bwrap_usable", lambda: None)
    with pytest.raises(ConfinementUnavailable, match="bubblewrap"):
        Confinement.required()
    assert not Confinement.where_available().confined  # what the user asked for by name still runs


@pytest.mark.skipif(bwrap_usable() is None, reason="bubblewrap cannot run here")
def test_a_confined_process_sees_its_folder_and_nothing_of_forges(tmp_path: Path, forge_home: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORGE_TEACHER_API_KEY", "sk-teacher")
    (forge_home / "secret.txt").write_text("forge's own file\n")
    folder = tmp_path / "task"
    folder.mkdir()
    confined = Confinement.required()
    script = (f"pwd; echo made > out.txt; cat {forge_home / 'secret.txt'} 2>&1 || true; env; "
              "touch /usr/planted 2>&1 || echo read-only")
    argv, env = confined.command(["sh", "-c", script], str(folder))
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == FOLDER_INSIDE and (folder / "out.txt").read_text() == "made\n"
    assert "forge's own file" not in done.stdout and "sk-teacher" not in done.stdout
    assert "FORGE_HOME" not in done.stdout and "read-only" in done.stdout
