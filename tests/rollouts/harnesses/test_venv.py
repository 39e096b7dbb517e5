"""rollouts/harnesses/venv.py: a pip harness's venv, made from the interpreter forge runs on; a step that fails
is one HarnessError naming the harness and pip's own last lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from openforge.errors import HarnessError
from openforge.rollouts.harnesses.venv import install_venv


@pytest.mark.slow  # ~10 s: the venv step installs pip (ensurepip)
def test_a_requirement_pip_cannot_install_names_the_harness_and_pips_reason(tmp_path: Path) -> None:
    lines: list[str] = []
    with pytest.raises(HarnessError, match=r"installing the test harness failed \(-m pip\): .*no-such-package"):
        install_venv(tmp_path / "venv", [str(tmp_path / "no-such-package")], what="the test harness",
                     on_line=lines.append)
    assert (tmp_path / "venv" / "bin" / "python").exists()  # the venv step ran; pip's failed
    assert lines  # pip's output was handed on as it came
