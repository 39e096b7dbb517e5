"""What a harness spec costs: the spec-driven `mini` (rollouts/harnesses/specs/mini.toml, run by
SpecHarness) against the Python adapter it replaced (`MiniHarness`), on the same task, engine and proxy.

Both run the same agent program in a local sandbox against the real proxy, with a scripted engine
behind it (one tool call, then the answer), so the rollout is all harness, sandbox and proxy work and
no model time. Rounds alternate between the two (so load on a shared machine falls on both alike);
figures are the median wall time per rollout, one rollout at a time, and the ratio spec / Python
(target <= 1.05). Then `forge harness check mini` time (one rollout through its own engine + proxy on
the tiny model), once building FORGE_HOME's tiny model and once with it there.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WRITE_HELLO = ('<tool_call>\n{"name": "write_file", "arguments": {"path": "hello.txt", '
               '"content": "hello world\\n"}}\n</tool_call>')


def _rollout_seconds(store, runner, task) -> float:  # noqa: ANN001
    from openforge.rollouts.runner.runner import RolloutSpec

    run = store.create_run(kind="eval")
    t0 = time.perf_counter()
    [ro] = asyncio.run(runner.run(run.id, [RolloutSpec(task)]))
    elapsed = time.perf_counter() - t0
    assert (ro.status, ro.reward) == ("scored", 1.0), (ro.status, ro.error, ro.stderr)
    return elapsed


def run(quick: bool = False) -> dict:
    from transformers import AutoTokenizer

    from openforge.config import ForgeConfig
    from openforge.engine.scripted import ScriptedEngine
    from openforge.engine.serve import serve_in_thread
    from openforge.engine.tiny import build_tiny_model
    from openforge.proxy.server import ProxyServer
    from openforge.rollouts.harnesses import get_harness
    from openforge.rollouts.harnesses.mini import MiniHarness
    from openforge.rollouts.runner.runner import RolloutRunner
    from openforge.rollouts.tasks.format import load_tasks
    from openforge.sandbox.testing import proxy_socket_path
    from openforge.store import Store

    rounds, per_round = (3, 2) if quick else (7, 4)
    with tempfile.TemporaryDirectory() as home:
        os.environ["FORGE_HOME"] = home
        model = build_tiny_model(Path(home) / "tiny")
        tokenizer = AutoTokenizer.from_pretrained(str(model))

        def script(prompt_ids: list[int]) -> str:  # the tool call, then the answer once its result is in
            return "Done: hello world" if "wrote 12 characters" in tokenizer.decode(prompt_ids[-200:]) else WRITE_HELLO

        store = Store(Path(home) / "forge.db")
        engine = serve_in_thread(ScriptedEngine(model, script).app)
        config = ForgeConfig()
        proxy = ProxyServer(config.proxy, store_path=store.path, engine_url=engine.url, model_path=model,
                            uds=proxy_socket_path())
        proxy.start()
        try:
            task = next(t for t in load_tasks("builtin") if t.id == "med-create-file")
            spec_harness, python_harness = get_harness(config.harness), MiniHarness(config.harness)
            assert type(spec_harness).__name__ != "MiniHarness", "harness 'mini' is not spec-driven"
            runners = {name: RolloutRunner(store, config=config, proxy_url=proxy.url, proxy_socket=proxy.uds,
                                           harness=harness)
                       for name, harness in (("spec", spec_harness), ("python", python_harness))}
            _rollout_seconds(store, runners["spec"], task)  # warm: imports, the first sandbox
            times: dict[str, list[float]] = {"spec": [], "python": []}
            for i in range(rounds):
                for name in (("spec", "python") if i % 2 == 0 else ("python", "spec")):
                    times[name] += [_rollout_seconds(store, runners[name], task) for _ in range(per_round)]
        finally:
            proxy.stop()
            engine.stop()
            store.close()
        check_s = []  # the first builds and warms up FORGE_HOME's tiny model; the second is the check alone
        for _ in range(2):
            t0 = time.perf_counter()
            check = subprocess.run([sys.executable, "-m", "openforge.forge_cli.main", "harness", "check", "mini"],
                                   capture_output=True, text=True, env={**os.environ, "FORGE_HOME": home}, timeout=600)
            check_s.append(time.perf_counter() - t0)
    spec_ms, python_ms = (statistics.median(times[n]) * 1000 for n in ("spec", "python"))
    result = {
        "rollouts_each": len(times["spec"]),
        "python_mini_ms_per_rollout": round(python_ms, 1),
        "spec_mini_ms_per_rollout": round(spec_ms, 1),
        "spec_vs_python_ratio": round(spec_ms / python_ms, 3),
        "harness_check_mini_first_s": round(check_s[0], 1),
        "harness_check_mini_s": round(check_s[1], 1),
        "harness_check_mini_ok": check.returncode == 0,
    }
    print(f"harness_spec: mini as a spec {result['spec_mini_ms_per_rollout']} ms per rollout vs the Python adapter "
          f"{result['python_mini_ms_per_rollout']} ms ({result['spec_vs_python_ratio']}x, median of "
          f"{result['rollouts_each']} each); forge harness check mini {result['harness_check_mini_s']} s "
          f"(the first, building the tiny model: {result['harness_check_mini_first_s']} s) "
          f"({'ok' if check.returncode == 0 else 'FAILED: ' + (check.stdout + check.stderr)[-300:]})")
    return result


if __name__ == "__main__":
    run(quick=True)
