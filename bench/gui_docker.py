"""What a GUI rollout's sandbox costs on Docker against the local bubblewrap backend, measured in the same
run, interleaved: start (docker: create + the image check; local: the folder), one GUI exec until the
task site is painted (Xvfb + chromium, the site through its socket), the same plus a screenshot and an
xdotool click, and stop. Medians of N rounds, docker / local ratios.

    DOCKER_HOST=... .venv/bin/python bench/gui_docker.py [N]
"""

from __future__ import annotations

import asyncio
import secrets
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from openforge.config import DockerSandboxConfig, LocalSandboxConfig  # noqa: E402
from openforge.rollouts.tasks.web.server import SiteSession  # noqa: E402
from openforge.rollouts.tasks.web.spec import GuiTask  # noqa: E402
from openforge.sandbox.factory import make_sandbox  # noqa: E402
from openforge.sandbox.container_images import ensure_image  # noqa: E402

ACT = '"$FORGE_PYTHON" -I "$FORGE_GUI" screenshot s.png && "$FORGE_PYTHON" -I "$FORGE_GUI" click 10 10'
PHASES = ("start", "gui exec (painted)", "+ screenshot + click", "stop")


async def one(config: object) -> dict[str, float]:
    site = SiteSession(GuiTask(site="colour", params={}))
    times: dict[str, float] = {}
    try:
        sb = make_sandbox(config, run_id="bench", rollout_id=f"bench-gui-{secrets.token_hex(4)}",  # type: ignore[arg-type]
                          site_socket=site.socket_path)
        t = time.monotonic()
        await sb.start()
        times["start"] = time.monotonic() - t
        try:
            sb.attach_gui(site.gui_spec())  # type: ignore[attr-defined]
            for phase, cmd in (("gui exec (painted)", "true"), ("+ screenshot + click", ACT)):
                t = time.monotonic()
                done = await sb.exec(cmd, timeout=180)
                times[phase] = time.monotonic() - t
                assert done.exit_code == 0, (phase, done.stderr)
            sb.attach_gui(None)  # type: ignore[attr-defined]
        finally:
            t = time.monotonic()
            await sb.stop()
            times["stop"] = time.monotonic() - t
    finally:
        site.close()
    return times


async def main(n: int) -> dict[str, dict[str, float]]:
    configs = {"local": LocalSandboxConfig(isolation="bwrap"),
               "docker": DockerSandboxConfig(image=ensure_image("browser", timeout=600))}
    rows: dict[str, list[dict[str, float]]] = {k: [] for k in configs}
    for _ in range(n):
        for name, config in configs.items():
            rows[name].append(await one(config))
    med = {k: {p: statistics.median(r[p] for r in v) for p in PHASES} for k, v in rows.items()}
    med = {k: {**v, "total": sum(v.values())} for k, v in med.items()}
    print(f"{'phase':24s} {'local ms':>9s} {'docker ms':>10s} {'docker/local':>13s}   (medians of {n})")
    for phase in (*PHASES, "total"):
        loc, dock = med["local"][phase], med["docker"][phase]
        print(f"{phase:24s} {loc * 1000:9.0f} {dock * 1000:10.0f} {dock / loc:12.1f}x")
    return {phase: {"local_ms": med["local"][phase] * 1000, "docker_ms": med["docker"][phase] * 1000,
                    "docker_over_local": med["docker"][phase] / med["local"][phase]} for phase in (*PHASES, "total")}


def run(quick: bool = False) -> dict[str, dict[str, float]]:
    """python -m bench's interface: the figures above (2 rounds when quick, else 5)."""
    return asyncio.run(main(2 if quick else 5))


if __name__ == "__main__":
    run() if len(sys.argv) < 2 else asyncio.run(main(int(sys.argv[1])))
