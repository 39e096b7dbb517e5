"""`python -m bench [NAME ...] [--quick]`: run the benchmarks, save results, refresh docs/performance.md.

Each benchmark is a module `bench/<name>.py` with `run(quick: bool = False) -> dict` that prints its
figures, each with a ratio against a baseline measured in the same run, and returns them. Results go
to `bench/results/<name>.json` with machine info; docs/performance.md shows the latest of each.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

BENCHES = ["proxy", "recording", "store_backends", "engine", "prefix_cache", "vl_engine", "trainer", "trainer_dist", "vl_dist", "cluster_capacity", "router", "verl_bridge", "sandboxes", "k8s_sandbox", "rollouts", "dashboard"]
ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
DOC = ROOT.parent / "docs" / "performance.md"


def machine_info() -> dict:
    info = {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        pass
    return info


def _flatten(prefix: str, value: object, out: dict[str, object]) -> None:
    if isinstance(value, dict):
        for key, sub in value.items():
            _flatten(f"{prefix}.{key}" if prefix else str(key), sub, out)
    else:
        out[prefix] = value


# A bench whose results hold "systems" (one dict of figures per system measured in the same run, e.g.
# bench/proxy.py's) also gets them side by side, latencies added over the "direct" row when it has one.
SYSTEM_COLUMNS = [("p50", "p50, c=1", "ms"), ("p50", "added p50, c=1", "added"), ("cpu_ms_c1", "CPU per call, c=1", "ms"),
                  ("rps", "req/s, c=32", "rate"), ("cpu_ms", "CPU per call, c=32", "ms"), ("ttfc", "TTFC added", "added")]


def systems_table(systems: dict[str, dict[str, float]]) -> list[str]:
    """Markdown rows of `systems` side by side (a blank cell where a system lacks the figure)."""
    direct = systems.get("direct", {})
    lines = ["| system | " + " | ".join(title for _, title, _ in SYSTEM_COLUMNS) + " |",
             "|---" * (len(SYSTEM_COLUMNS) + 1) + "|"]
    for name, figures in systems.items():
        cells = []
        for key, _, kind in SYSTEM_COLUMNS:
            value = figures.get(key)
            if value is None or (kind == "added" and (name == "direct" or key not in direct)):
                cells.append("")
            elif kind == "added":
                cells.append(f"{value - direct[key]:.2f} ms")
            elif kind == "rate":
                cells.append(f"{value:,.0f}")
            else:
                cells.append(f"{value:.2f} ms")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def write_doc() -> None:
    lines = ["# Performance", "",
             "Latest results of `python -m bench` (medians over repeats; ratios are against a baseline",
             "measured in the same run, on the same machine). Raw results: `bench/results/*.json`.", ""]
    for name in BENCHES:
        path = RESULTS / f"{name}.json"
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        lines += [f"## {name}", "", f"Measured {data['when']} on {data['machine'].get('platform')}, "
                  f"{data['machine'].get('cpus')} CPUs, torch {data['machine'].get('torch')}"
                  f"{' (quick mode)' if data.get('quick') else ''}.", ""]
        systems = data["results"].get("systems") if isinstance(data["results"], dict) else None
        if isinstance(systems, dict) and systems:
            lines += ["Side by side:", ""] + systems_table(systems) + ["", "All figures:", ""]
        lines += ["| figure | value |", "|---|---|"]
        flat: dict[str, object] = {}
        _flatten("", data["results"], flat)
        for key, value in flat.items():
            shown = f"{value:.4g}" if isinstance(value, float) else str(value)
            lines.append(f"| {key} | {shown} |")
        lines.append("")
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"benchmarks to run (default: all of {', '.join(BENCHES)})")
    parser.add_argument("--quick", action="store_true", help="fewer repeats: a smoke run, not a measurement")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHES]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}; choose from {', '.join(BENCHES)}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    failed = []
    for name in args.names or BENCHES:
        print(f"\n=== bench {name} ===", flush=True)
        try:
            module = importlib.import_module(f"bench.{name}")
            results = module.run(quick=args.quick)
        except Exception as exc:  # noqa: BLE001 - one failing benchmark must not hide the others
            traceback.print_exc()
            print(f"bench {name}: FAILED: {exc}", file=sys.stderr)
            failed.append(name)
            continue
        record = {"name": name, "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                  "quick": args.quick, "machine": machine_info(), "results": results}
        (RESULTS / f"{name}.json").write_text(json.dumps(record, indent=2, default=str))
    write_doc()
    print(f"\nresults in {RESULTS}; table in {DOC}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
