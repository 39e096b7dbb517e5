"""The layers of docs/architecture.md hold in the code: a package imports only packages below it, so
following a run's data never climbs back up a layer. Every import counts, function-level ones too."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Lowest first. A package may import the packages of lower layers, never its own layer's others or above.
LAYERS: list[set[str]] = [
    {"openforge"},
    {"engine", "sandbox"},
    {"proxy", "rollouts"},
    {"trainer"},
    {"runs", "integrations"},
    {"forge_cli"},
]
LAYER = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}


def imported_packages(path: Path) -> set[str]:
    """The forge packages a module imports (`openforge.proxy.x` -> proxy; `openforge.config` -> openforge)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "openforge":
                found.add(parts[1] if len(parts) > 1 and parts[1] in LAYER else "openforge")
    return found


def test_every_installed_package_has_a_layer() -> None:
    installed = {d.name for d in REPO.iterdir() if (d / "__init__.py").is_file()} - {"tests", "bench"}
    assert installed == set(LAYER), installed ^ set(LAYER)


def test_no_package_imports_its_own_layer_or_above() -> None:
    climbs = []
    for pkg, layer in LAYER.items():
        for module in sorted((REPO / pkg).rglob("*.py")):
            for target in imported_packages(module) - {pkg}:
                if LAYER[target] >= layer:
                    climbs.append(f"{module.relative_to(REPO)} imports openforge.{target}")
    assert not climbs, "imports against the layers of docs/architecture.md:\n" + "\n".join(climbs)


def test_the_checker_sees_function_level_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from openforge.runs.train import run_training\n    import openforge.config\n")
    assert imported_packages(module) == {"runs", "openforge"}
