"""The `[osworld]` extra installs what each supported OSWorld metric's module imports (rollouts/tasks/osworld/metric.py).

desktop-env is installed with `--no-deps` (its own pins pull torch 2.5, easyocr and cloud SDKs), so the extra is
all a metric module has: one import missing from it and the metric cannot load after the documented install
(issue 44: table.py's `import pandas`, and compare_table grades most Calc tasks). Checked statically against
the imports at the top of desktop-env 1.0.2's metric modules, as read from its wheel, so it runs without it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from tests.helpers.paths import REPO
from openforge.rollouts.tasks.osworld.metric import ABSENT_IMPORTS, METRIC_MODULES

# module of desktop_env/evaluators/metrics -> the third-party packages its top imports (desktop-env 1.0.2);
# `utils` is imported by table.py and general.py.
TOP_IMPORTS = {
    "general": {"lxml", "pdfplumber", "yaml", "docx", "rapidfuzz", "cssselect"},
    "chrome": {"rapidfuzz", "bs4", "fitz", "PIL", "borb", "imagehash"},
    "table": {"openpyxl", "pandas", "rapidfuzz"},
    "docs": {"numpy", "easyocr", "PIL", "docx", "odf", "rapidfuzz", "skimage"},
    "slides": {"pptx"},
    "vscode": {"PyPDF2"},
    "utils": {"formulas", "lxml", "cssselect", "xmltodict", "openpyxl", "tldextract"},
}
DISTRIBUTION = {"lxml": "lxml", "pdfplumber": "pdfplumber", "yaml": "pyyaml", "docx": "python-docx",
                "rapidfuzz": "rapidfuzz", "cssselect": "cssselect", "bs4": "beautifulsoup4", "fitz": "pymupdf",
                "PIL": "pillow", "openpyxl": "openpyxl", "pandas": "pandas", "numpy": "numpy", "odf": "odfpy",
                "pptx": "python-pptx", "formulas": "formulas", "xmltodict": "xmltodict", "tldextract": "tldextract"}
# installed by a base dependency of forge's own: numpy by torch, PyYAML by transformers
CARRIED = {"numpy": "torch", "pyyaml": "transformers"}


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=~!\[ ;]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_osworld_extra_installs_every_supported_metric_modules_imports() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extra, base = _names(project["optional-dependencies"]["osworld"]), _names(project["dependencies"])
    modules = set(METRIC_MODULES.values()) | {"utils"}
    assert modules <= set(TOP_IMPORTS)
    missing = {}
    for module in sorted(modules):
        stood_in = {name.split(".")[0] for name in ABSENT_IMPORTS.get(module, ())}
        for name in sorted(TOP_IMPORTS[module] - stood_in):
            dist = DISTRIBUTION[name]
            if dist not in extra | base and CARRIED.get(dist) not in base:
                missing.setdefault(module, []).append(dist)
    assert missing == {}
