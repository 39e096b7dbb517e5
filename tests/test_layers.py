"""The layers of docs/architecture.md hold in the code: a package imports only packages below it, so
following a run's data never climbs back up a layer. Every import counts, function-level ones too.

And static readers see the same package: a walk of the *installed* openforge, found and read as Pyright
or jedi would (site-packages and the folders its .pth lines name, files parsed, nothing imported), resolves
every `openforge.*` import and finds the same edges as the source (install_links.py, issue 46)."""

from __future__ import annotations

import ast
import functools
import os
import site
import sysconfig
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


@functools.cache
def _imported_modules(real_path: str) -> tuple[str, ...]:
    """Every module a file imports, by its absolute name (`from x import y` names x); read once per file."""
    names: list[str] = []
    for node in ast.walk(ast.parse(Path(real_path).read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return tuple(names)


def imported_modules(path: Path) -> tuple[str, ...]:
    return _imported_modules(os.path.realpath(path))


def imported_packages(path: Path) -> set[str]:
    """The forge packages a module imports (`openforge.proxy.x` -> proxy; `openforge.config` -> openforge)."""
    found: set[str] = set()
    for name in imported_modules(path):
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


# -- the installed package, read statically ------------------------------------------------------------

def installed_package() -> Path | None:
    """The `openforge` folder a static reader finds on this interpreter's path without importing it:
    in site-packages (a wheel) or in a folder a `.pth` line names (an editable install's link tree).
    An import hook's `.pth` line (`import ...`) is code, which static readers do not run."""
    for site_dir in sorted({sysconfig.get_paths()["purelib"], *site.getsitepackages()}):
        roots = [Path(site_dir)]
        for pth in sorted(Path(site_dir).glob("*.pth")):
            lines = [line.strip() for line in pth.read_text(encoding="utf-8").splitlines()]
            roots += [Path(site_dir) / line for line in lines if line and not line.startswith(("#", "import"))]
        for root in roots:
            if (root / "openforge" / "__init__.py").is_file():
                return root / "openforge"
    return None


def installed_modules(package: Path) -> dict[str, Path]:
    """'proxy/app.py' -> its file, for every module under the installed `package`, links followed."""
    found: dict[str, Path] = {}
    for folder, dirs, files in os.walk(package, followlinks=True):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                found[(Path(folder) / name).relative_to(package).as_posix()] = Path(folder) / name
    return found


def source_modules() -> dict[str, Path]:
    """The same keys for the repository's folders, laid out as setup.py installs them (proxy/ -> openforge.proxy)."""
    return {(module.relative_to(REPO / pkg).as_posix() if pkg == "openforge" else
             f"{pkg}/{module.relative_to(REPO / pkg).as_posix()}"): module
            for pkg in LAYER for module in sorted((REPO / pkg).rglob("*.py"))}


def layer_edges(modules: dict[str, Path]) -> set[tuple[str, str]]:
    """(package, package it imports) for every module: what test_no_package_imports_its_own_layer_or_above judges."""
    edges = set()
    for key, path in modules.items():
        first = key.split("/")[0]
        pkg = first if "/" in key and first in LAYER else "openforge"
        edges |= {(pkg, target) for target in imported_packages(path) - {pkg}}
    return edges


def unresolved_imports(package: Path, modules: dict[str, Path]) -> list[str]:
    """`openforge.*` modules imported somewhere that are no file under the installed `package`."""
    def exists(name: str) -> bool:
        rel = Path(*name.split(".")[1:])
        return (package / rel / "__init__.py").is_file() or (package / rel.with_suffix(".py")).is_file()

    return [f"{key}: {name}" for key, path in sorted(modules.items()) for name in imported_modules(path)
            if name.split(".")[0] == "openforge" and not exists(name)]


def test_static_readers_see_the_installed_package() -> None:
    package = installed_package()
    assert package is not None, ("no openforge/ in site-packages or in a folder a .pth file names: static readers "
                                 "see nothing of the install; run ./install.sh (it runs install_links.py)")
    installed, source = installed_modules(package), source_modules()
    stale = sorted(set(source) - set(installed))
    assert not stale, f"modules the installed tree at {package} lacks: {stale}; run ./install.sh again"
    unresolved = unresolved_imports(package, installed)
    assert not unresolved, f"imports no file under {package} answers: {unresolved[:20]}"
    edges = layer_edges(installed)
    assert edges == layer_edges(source)
    assert {("forge_cli", "runs"), ("runs", "trainer"), ("sandbox", "openforge")} <= edges  # the walk saw the folders


def test_the_static_walk_reads_a_link_tree_as_readers_do(tmp_path: Path) -> None:
    """A tree like install_links.py's: the folder linked whole, the import resolved through the link,
    an import of a module that exists nowhere reported."""
    (tmp_path / "src" / "proxy").mkdir(parents=True)
    (tmp_path / "src" / "proxy" / "__init__.py").write_text("")
    (tmp_path / "src" / "proxy" / "app.py").write_text("from openforge.sandbox.base import X\nimport openforge.nope\n")
    (tmp_path / "src" / "sandbox").mkdir()
    (tmp_path / "src" / "sandbox" / "__init__.py").write_text("")
    (tmp_path / "src" / "sandbox" / "base.py").write_text("X = 1\n")
    package = tmp_path / "tree" / "openforge"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for folder in ("proxy", "sandbox"):
        (package / folder).symlink_to(tmp_path / "src" / folder, target_is_directory=True)
    modules = installed_modules(package)
    assert set(modules) == {"__init__.py", "proxy/__init__.py", "proxy/app.py", "sandbox/__init__.py", "sandbox/base.py"}
    assert layer_edges(modules) == {("proxy", "sandbox"), ("proxy", "openforge")}
    assert unresolved_imports(package, modules) == ["proxy/app.py: openforge.nope"]
