"""What the in-sandbox agents (mini_agent.py, mini_gui_agent.py, browser_use_agent.py) share: their
harness copies this file beside the agent in .forge/, where the agent imports it (stdlib only).

The agent writes its answer and result files after the policy has acted in the same folders: whatever
the policy (or a browser's save dialog) left at those paths must not make the write raise, which would
end the agent with a traceback and the rollout as a harness failure, its group dropped instead of scored.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

SOURCE = Path(__file__)
SANDBOX_PATH = ".forge/agent_files.py"  # relative to the sandbox's working directory, beside the agents
# Where a harness's final answer is left for a shell verifier, relative to the sandbox's working
# directory: an agent writes it itself, the runner writes it from any other harness's outcome. The one
# definition: the in-sandbox agents cannot import the package, the package imports this file.
ANSWER_FILE = ".forge/answer.txt"


def write_afresh(path: str, text: str) -> None:
    """Write a file of ours whatever stands at its path: a folder, a link or a FIFO there (or at its
    folder) is moved aside, never followed; the new file replaces the path in one rename."""
    target, aside = Path(path), f".left-{os.getpid()}-{time.monotonic_ns()}"
    folder = target.parent
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        folder.rename(folder.with_name(folder.name + aside))
    folder.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() or (target.exists() and not target.is_file()):
        target.rename(target.with_name(target.name + aside))
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, target)
