"""One OSWorld metric call, run on the host in a child process: `python -m openforge.rollouts.tasks.osworld.metric`.

The metric functions are OSWorld's own (the `desktop-env` package, installed with `--no-deps`: its
declared dependencies pin torch 2.5, easyocr and cloud SDKs). Its `metrics/__init__.py` imports every
metric module, and with them easyocr, librosa and playwright; so the package is entered as a bare
shell and only the module that holds the named function is imported, with the small dependencies of
the `[osworld]` extra. docs.py, vscode.py and chrome.py also import, at their top, packages that none
of the functions forge takes from them calls (easyocr and scikit-image, PyPDF2, borb and imagehash): those
imports get a stand-in (`_Absent`) whose every use raises `AbsentImportUsed`, a BaseException so that no
`except Exception` in a metric can turn it into a score. A child process because the metrics print to stdout and a
hostile file can make openpyxl or pandas spin: the grader waits on it with a limit, and its output is never a score.

stdin: {"func": NAME, "result": VALUE, "expected": VALUE or null, "options": {...}}
stdout: one JSON line {"score": X} or {"error": "..."} (the metric raised on the files it was given)
exit 2: the metric could not be loaded, or used a stood-in import (the machinery's failure, not the policy's)
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

# metric name -> the module of desktop_env/evaluators/metrics that defines it. Only metrics whose getters
# the importer maps (vm_file, vm_command_line, rule, cloud_file, cache_file).
METRIC_MODULES = {
    "exact_match": "general",
    "check_include_exclude": "general",
    "check_direct_json_object": "general",
    "check_list": "general",
    "compare_pdfs": "chrome",
    "compare_table": "table",
    "compare_docx_files": "docs",
    "compare_docx_files_and_ignore_new_lines": "docs",
    "compare_pptx_files": "slides",
    "compare_text_file": "vscode",
    "check_json_settings": "vscode",
}

# module -> the imports at its top that the functions above never use (read from desktop-env 1.0.2's
# source: docs.py's compare_docx_files* use python-docx, odfpy, rapidfuzz and re; easyocr serves its
# compare_image_text, scikit-image its colour checks; vscode.py's PyPDF2 serves compare_pdf_content; chrome.py's
# compare_pdfs reads with PyMuPDF (`fitz`) and rapidfuzz, while borb and imagehash serve compare_pdf_images).
# Installing them would pull a second torch (easyocr) for nothing.
ABSENT_IMPORTS = {
    "docs": ("easyocr", "skimage", "skimage.color"),
    "vscode": ("PyPDF2",),
    "chrome": ("borb", "borb.pdf", "imagehash"),
}


class MetricUnavailable(Exception):
    """OSWorld's metric module cannot be imported here."""


class AbsentImportUsed(BaseException):
    """The metric used an import forge stood in for (ABSENT_IMPORTS). A BaseException: a metric's own
    `except Exception: return 0` must not turn the machinery's gap into a score."""


class _Absent:
    """What a stand-in module hands out for any name: any use of it raises AbsentImportUsed."""

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def _unavailable(self, *_: Any, **__: Any) -> Any:
        raise AbsentImportUsed(f"the metric used {object.__getattribute__(self, '_name')}, "
                               "which forge does not install (rollouts/tasks/osworld/metric.py, ABSENT_IMPORTS)")

    def __getattr__(self, attr: str) -> Any:
        return self._unavailable()

    __call__ = __getitem__ = __iter__ = __setattr__ = __bool__ = __len__ = _unavailable


def _stand_in(name: str) -> types.ModuleType:
    module = types.ModuleType(name, "a stand-in for an import OSWorld's metric does not use")
    module.__getattr__ = lambda attr: _Absent(f"{name}.{attr}")  # type: ignore[method-assign]  # PEP 562
    module.__path__ = []  # a package, so `from skimage.color import ...` finds its submodule stand-in
    return module


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
    for absent in ABSENT_IMPORTS.get(module, ()):
        sys.modules.setdefault(absent, _stand_in(absent))
    try:
        return getattr(importlib.import_module(f"{package}.{module}"), name)
    except (ImportError, AbsentImportUsed) as exc:  # the latter: the module's top used a stand-in
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
    except AbsentImportUsed as exc:
        print(json.dumps({"unavailable": str(exc)}), file=out)
        return 2
    except Exception as exc:  # noqa: BLE001 - OSWorld's metric raised on the files it was given
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:500]}), file=out)
        return 0
    print(json.dumps({"score": score}), file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
