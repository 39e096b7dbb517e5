"""What a display costs a local sandbox exec: `true` under bubblewrap plain (the baseline), with an Xvfb
display, and with the display and chromium showing a task site painted (sandbox/gui.py), plus one
screenshot and one xdotool click. Medians of N runs, ratios to the baseline measured in the same run.

    .venv/bin/python bench/gui_sandbox.py [N]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from openforge.config import LocalSandboxConfig  # noqa: E402
from openforge.rollouts.tasks.web.server import SiteSession  # noqa: E402
from openforge.rollouts.tasks.web.spec import GuiTask  # noqa: E402
from openforge.sandbox.gui import GuiSpec  # noqa: E402
from openforge.sandbox.local import LocalSandbox  # noqa: E402

ACT = '"$FORGE_PYTHON" -I "$FORGE_GUI" screenshot s.png && "$FORGE_PYTHON" -I "$FORGE_GUI" click 10 10'


async def main(n: int) -> None:
    site = SiteSession(GuiTask(site="colour", params={}))
    root = Path(tempfile.mkdtemp(prefix="forge-bench-gui-"))
    try:
        async with LocalSandbox(LocalSandboxConfig(), run_id="bench", rollout_id="bench-gui", root=root) as sb:
            cases = {"plain exec": (None, "true"), "+ Xvfb": (GuiSpec(), "true"),
                     "+ Xvfb + chromium (page painted)": (site.gui_spec(), "true"),
                     "+ screenshot + click": (site.gui_spec(), ACT)}
            times: dict[str, list[float]] = {k: [] for k in cases}
            for _ in range(n):
                for name, (spec, cmd) in cases.items():
                    sb.attach_gui(spec)
                    t = time.monotonic()
                    done = await sb.exec(cmd, timeout=120)
                    times[name].append(time.monotonic() - t)
                    assert done.exit_code == 0, (name, done.stderr)
            base = statistics.median(times["plain exec"])
            for name, ts in times.items():
                med = statistics.median(ts)
                print(f"{name:36s} median {med * 1000:7.0f} ms  ({med / base:5.1f}x plain)  n={len(ts)}")
    finally:
        site.close()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
