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

import os
import statistics
import subprocess
import sys
import time


def run(quick: bool = False) -> dict:
    from openforge.rollouts.harnesses import get_harness
    from openforge.rollouts.harnesses.mini import MiniHarness
    from openforge.rollouts.runner.runner import RolloutRunner
    from openforge.rollouts.tasks.format import load_tasks

    from bench.mini_rig import alternate, mini_rig, rollout_seconds

    rounds, per_round = (3, 2) if quick else (7, 4)
    with mini_rig() as rig:
        task = next(t for t in load_tasks("builtin") if t.id == "med-create-file")
        spec_harness, python_harness = get_harness(rig.config.harness), MiniHarness(rig.config.harness)
        assert type(spec_harness).__name__ != "MiniHarness", "harness 'mini' is not spec-driven"
        runners = {name: RolloutRunner(rig.store, config=rig.config, proxy_url=rig.proxy.url,
                                       proxy_socket=rig.proxy.uds, harness=harness)
                   for name, harness in (("spec", spec_harness), ("python", python_harness))}
        rollout_seconds(rig.store, runners["spec"], task)  # warm: imports, the first sandbox
        times = alternate({name: (lambda r=r: rollout_seconds(rig.store, r, task)) for name, r in runners.items()},
                          rounds=rounds, per_round=per_round)
        home = str(rig.home)
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
