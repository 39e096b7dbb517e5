"""Pip harnesses' install: a venv of their own in the harness cache (beside the npm harnesses, so a
local sandbox sees it read-only exactly as it sees those), made from the interpreter forge runs on."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from openforge.errors import HarnessError
from openforge.rollouts.harnesses.npm import install_env

INSTALL_TIMEOUT_S = 900.0


def install_venv(venv: Path, requirements: list[str], *, what: str, timeout: float = INSTALL_TIMEOUT_S,
                 on_line: Callable[[str], None] | None = None) -> Path:
    """A fresh venv at `venv` with `requirements` pip-installed; its python. HarnessError (naming `what`)
    with pip's last lines when a step fails."""
    venv.parent.mkdir(parents=True, exist_ok=True)
    base = getattr(sys, "_base_executable", sys.executable)  # the interpreter this venv was made from
    steps = [[base, "-m", "venv", "--clear", str(venv)],
             [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", *requirements]]
    for argv in steps:
        try:
            with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  stdin=subprocess.DEVNULL, env=install_env()) as proc:
                assert proc.stdout is not None
                tail: list[str] = []
                for line in proc.stdout:
                    tail = [*tail[-20:], line.rstrip()]
                    if on_line:
                        on_line(line.rstrip())
                code = proc.wait(timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise HarnessError(f"installing {what} failed: {' '.join(argv[:3])}: {exc}") from None
        if code != 0:
            shown = [ln for ln in tail if ln and not ln.startswith("WARNING: Location")][-3:]
            raise HarnessError(f"installing {what} failed ({' '.join(argv[1:3])}): {' | '.join(shown) or code}")
    return venv / "bin" / "python"
