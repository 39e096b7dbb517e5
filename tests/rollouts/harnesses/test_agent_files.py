"""rollouts/harnesses/agent_files.py: an in-sandbox agent writes its answer whatever the policy left at that path
(a link, a folder, a FIFO): moved aside, never followed, so the write cannot raise or leak outside."""

from __future__ import annotations

import os
from pathlib import Path

from openforge.rollouts.harnesses.agent_files import ANSWER_FILE, SANDBOX_PATH, SOURCE, write_afresh


def test_a_link_at_the_path_is_moved_aside_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "host-secret.txt"
    outside.write_text("keep me")
    work = tmp_path / "work"
    (work / ".forge").mkdir(parents=True)
    (work / ".forge" / "answer.txt").symlink_to(outside)
    write_afresh(str(work / ".forge" / "answer.txt"), "42")
    assert (work / ".forge" / "answer.txt").read_text() == "42" and not (work / ".forge" / "answer.txt").is_symlink()
    assert outside.read_text() == "keep me"


def test_a_folder_or_fifo_at_the_path_or_its_folder_does_not_stop_the_write(tmp_path: Path) -> None:
    (tmp_path / "a" / "answer.txt").mkdir(parents=True)
    write_afresh(str(tmp_path / "a" / "answer.txt"), "x")
    assert (tmp_path / "a" / "answer.txt").read_text() == "x"
    os.mkfifo(tmp_path / "fifo.txt")
    write_afresh(str(tmp_path / "fifo.txt"), "y")  # opening a FIFO for writing would block forever
    assert (tmp_path / "fifo.txt").read_text() == "y"
    (tmp_path / "b").write_text("a file where the folder should be")
    write_afresh(str(tmp_path / "b" / "answer.txt"), "z")
    assert (tmp_path / "b" / "answer.txt").read_text() == "z"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("b.left-")]  # the file, kept aside


def test_the_agents_find_this_file_where_the_harness_copies_it() -> None:
    assert SOURCE.name == "agent_files.py" and SOURCE.is_file()
    assert SANDBOX_PATH == ".forge/agent_files.py" and ANSWER_FILE.startswith(".forge/")
