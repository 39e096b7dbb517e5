"""A browser-use rollout in a Docker container of the browser-use image against the same rollout in a local
bubblewrap sandbox, measured in the same run, interleaved: gui-colour-click-blue through the real
RolloutRunner and recording proxy to a scripted engine on the tiny Qwen2-VL that clicks the blue button
browser-use lists, then says done (two calls, each with a screenshot). Medians of N rounds, docker / local.

    DOCKER_HOST=... .venv/bin/python bench/browser_use_docker.py [N]

Needs browser-use in the harness cache ($FORGE_NPM_CACHE or ~/.cache/openforge-npm) and the browser
image (its cached tarball); builds the browser-use image if the engine lacks it (timed, reported).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from openforge.config import DockerSandboxConfig, ForgeConfig, HarnessConfig, LocalSandboxConfig  # noqa: E402

CACHE = Path(os.environ.get("FORGE_NPM_CACHE") or Path.home() / ".cache" / "openforge-npm").expanduser()
TASK = "gui-colour-click-blue"


def policy(engine: Any, input_ids: list[int], index: int) -> str:
    state = engine.tokenizer.decode(input_ids).rsplit("<browser_state>", 1)[-1]
    buttons = re.findall(r"\[(\d+)\]<button", state)
    action = ({"click": {"index": int(buttons[index])}} if len(buttons) == 4 else
              {"done": {"text": "clicked", "success": True, "files_to_display": []}})
    return json.dumps({"thinking": "", "evaluation_previous_goal": "", "memory": "", "next_goal": "", "action": [action]})


def one(store: Any, model: Path, sandbox: Any) -> tuple[float, float | None]:
    from openforge.engine.scripted import ScriptedEngine
    from openforge.engine.serve import serve_in_thread
    from openforge.proxy.server import ProxyServer
    from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
    from openforge.rollouts.tasks.format import load_tasks
    from openforge.rollouts.tasks.web.payload import WebPayload
    from openforge.sandbox.testing import proxy_socket_path

    task = next(t for t in load_tasks("builtin-web") if t.id == TASK)
    blue = task.payload(WebPayload).gui.params["order"].index("blue")  # type: ignore[union-attr]
    engine: Any = None
    engine = ScriptedEngine(model, lambda ids: policy(engine, ids, blue))
    cfg = ForgeConfig()
    cfg.sandbox = sandbox
    cfg.harness = HarnessConfig(name="browser-use", max_turns=4, npm_cache=str(CACHE))
    cfg.proxy.max_context_tokens = 65536
    cfg.runner.time_limit_scale = 5.0
    with serve_in_thread(engine.app) as eng, ProxyServer(cfg.proxy, store_path=store.path, engine_url=eng.url,
                                                          model_path=model, uds=proxy_socket_path()) as proxy:
        run = store.create_run(kind="eval")
        runner = RolloutRunner(store, config=cfg, proxy_url=proxy.url, proxy_socket=proxy.uds)
        start = time.monotonic()
        [ro] = asyncio.run(runner.run(run.id, [RolloutSpec(task)]))
        return time.monotonic() - start, ro.reward


def main(n: int) -> dict[str, Any]:
    from openforge.engine.tiny_vl import build_tiny_vl_model
    from openforge.store import Store
    from openforge.rollouts.harnesses.browseruse import image_layer
    from openforge.sandbox.harness_image import ensure_venv_image

    with tempfile.TemporaryDirectory(prefix="forge-bench-bu-") as tmp:
        os.environ["FORGE_HOME"] = str(Path(tmp) / "home")
        os.environ["FORGE_NPM_CACHE"] = str(CACHE)
        t = time.monotonic()
        tag = ensure_venv_image(image_layer(CACHE), timeout=900)
        image_s = time.monotonic() - t
        model = build_tiny_vl_model(Path(tmp) / "tiny-vl")
        store = Store(Path(tmp) / "home" / "forge.db")
        configs = {"local": LocalSandboxConfig(isolation="bwrap"), "docker": DockerSandboxConfig(image=tag)}
        rows: dict[str, list[float]] = {k: [] for k in configs}
        rewards: dict[str, list[float | None]] = {k: [] for k in configs}
        for _ in range(n):
            for name, config in configs.items():
                seconds, reward = one(store, model, config)
                rows[name].append(seconds)
                rewards[name].append(reward)
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"browser-use image {tag}: ready in {image_s:.1f} s")
    print(f"one rollout of {TASK}, medians of {n}: local {med['local']:.1f} s, docker {med['docker']:.1f} s "
          f"({med['docker'] / med['local']:.2f}x); rewards {rewards}")
    return {"image_ready_s": image_s, "local_s": med["local"], "docker_s": med["docker"],
            "docker_over_local": med["docker"] / med["local"], "rewards": rewards}


def run(quick: bool = False) -> dict[str, Any]:
    """python -m bench's interface: the figures above (1 round when quick, else 3)."""
    return main(1 if quick else 3)


if __name__ == "__main__":
    run() if len(sys.argv) < 2 else main(int(sys.argv[1]))
