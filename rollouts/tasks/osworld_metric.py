"""One OSWorld metric call, run on the host in a child process: `python -m openforge.rollouts.tasks.osworld_metric`.

The metric functions are OSWorld's own (the `desktop-env` package, installed with `--no-deps`: its
declared dependencies pin torch 2.5, easyocr and cloud SDKs). Its `metrics/__init__.py` imports every
metric module, and with them easyocr, librosa and playwright; so the package is entered as a bare
shell and only the module that holds the named function is imported, with the small dependencies of
the `[osworld]` extra. A child process because the metrics print to stdout and a hostile file can make
openpyxl or pandas spin: the grader waits on it with a limit, and its output is never a score.

stdin: {"func": NAME, "result": VALUE, "expected": VALUE or null, "options": {...}}
stdout: one JSON line {"score": X} or {"error": "..."} (the metric raised on the files it was given)
exit 2: the metric could not be loaded (the machinery's failure, not the policy's)
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import sys
import types
from collections.abc import Callable
from typing import Any

# metric name -> the module of desktop_env/evaluators/metrics that defines it. compare_docx_files
# (docs.py) and compare_pptx_files (slides.py) are left out: those modules import easyocr /
# scikit-image at their top, which pull a second torch (docs/tasks.md, "OSWorld-format tasks").
METRIC_MODULES = {
    "exact_match": "general",
    "check_include_exclude": "general",
    "compare_table": "table",
}


class MetricUnavailable(Exception):
    """OSWorld's metric module cannot be imported here."""


def load_metric(name: str) -> Callable[..., Any]:
    """OSWorld's metric function `name`, imported from its own module without the package's __init__."""
    module = METRIC_MODULES.get(name)
    if module is None:
        raise MetricUnavailable(f"metric {name!r} is not supported (supported: {', '.join(sorted(METRIC_MODULES))})")
    package = "desktop_env.evaluators.metrics"
    if package not in sys.modules:
        spec = importlib.util.find_spec("desktop_env")
        if spec is None or spec.origin is None:
            raise MetricUnavailable("OSWorld's metrics need its package: pip install --no-deps desktop-env==1.0.2 "
                                    "and pip install 'openforge[osworld]'")
        shell = types.ModuleType(package)  # the package, its __init__ (every metric's imports) not run
        shell.__path__ = [os.path.join(os.path.dirname(spec.origin), "evaluators", "metrics")]
        sys.modules[package] = shell
    try:
        return getattr(importlib.import_module(f"{package}.{module}"), name)
    except ImportError as exc:
        raise MetricUnavailable(f"OSWorld's metrics/{module}.py cannot be imported: {exc} "
                                "(pip install 'openforge[osworld]')") from None


def main() -> int:
    job = json.load(sys.stdin)
    try:
        metric = load_metric(job["func"])
    except MetricUnavailable as exc:
        print(json.dumps({"unavailable": str(exc)}))
        return 2
    args = [job["result"]] + ([job["expected"]] if job.get("expected") is not None else [])
    out = sys.stdout
    try:
        with contextlib.redirect_stdout(sys.stderr):  # the metrics print what they compare
            score = float(metric(*args, **job.get("options", {})))
    except Exception as exc:  # noqa: BLE001 - OSWorld's metric raised on the files it was given
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:500]}), file=out)
        return 0
    print(json.dumps({"score": score}), file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
