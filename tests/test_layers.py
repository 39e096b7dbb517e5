"""The layers of docs/architecture.md hold in the code: a package imports only packages below it, so
following a run's data never climbs back up a layer. Every import counts, function-level ones too.

And static readers see the same package: a walk of the *installed* openforge, found and read as Pyright
or jedi would (site-packages and the folders its .pth lines name, files parsed, nothing imported), resolves
every `openforge.*` import and finds the same edges as the source (install_links.py, issue 46).

And no import circle inside a package: the modules of one folder (rollouts/runner/, trainer/, ...) import each
other one way, so the piece two need lives in a module both import, and each module loads, reads and tests
without the ones that import it. Every import counts there too: type-only (`if TYPE_CHECKING:`) ones as
well, as static readers see them (issue 46)."""

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


# -- no circle inside a package -------------------------------------------------------------------------

# Circles known and not yet untied, each with why it stands; one untied must leave this list too.
KNOWN: dict[frozenset[str], str] = {}


def module_file(name: str, root: Path = REPO) -> Path | None:
    """The file of `openforge.<...>` as setup.py installs it (openforge.proxy.app -> proxy/app.py), or None."""
    parts = name.split(".")
    if parts[0] != "openforge":
        return None
    rel = Path(*parts[1:]) if len(parts) > 1 and parts[1] in LAYER and parts[1] != "openforge" else Path(*parts)
    for path in (root / rel / "__init__.py", (root / rel).with_suffix(".py")):
        if path.is_file():
            return path
    return None


def imported_files(path: Path, name: str, root: Path = REPO) -> set[Path]:
    """The forge modules `path` (module `name`) imports, anywhere in it: `from a import b` names a.b when b is
    a module, else a; relative imports resolved against `name`."""
    found: set[Path] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            candidates = [f"{base}.{a.name}" if module_file(f"{base}.{a.name}", root) else base for a in node.names]
        else:
            continue
        found |= {f for f in (module_file(c, root) for c in candidates) if f is not None and f != path}
    return found


def folder_circles(folder: Path, name: str, root: Path = REPO) -> list[frozenset[str]]:
    """The import circles among the modules directly in `folder` (package `name`), as sets of paths relative to
    `root`: the strongly connected components of more than one module (Tarjan's algorithm)."""
    modules = {p: f"{name}.{p.stem}" if p.name != "__init__.py" else name for p in sorted(folder.glob("*.py"))}
    graph = {p: imported_files(p, n, root) & set(modules) for p, n in modules.items()}
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    circles: list[frozenset[str]] = []

    def visit(v: Path) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                circles.append(frozenset(p.relative_to(root).as_posix() for p in [v, *component]))

    for v in graph:
        if v not in index:
            visit(v)
    return circles


def all_circles(root: Path = REPO) -> list[frozenset[str]]:
    found = []
    for top in sorted(LAYER):
        for init in sorted((root / top).rglob("__init__.py")):
            folder = init.parent
            dotted = ".".join(folder.relative_to(root / top).parts)
            name = "openforge" + (f".{top}" if top != "openforge" else "") + (f".{dotted}" if dotted else "")
            found += folder_circles(folder, name, root)
    return found


def test_no_import_circle_inside_a_package() -> None:
    found = all_circles()
    new = [sorted(c) for c in found if c not in KNOWN]
    assert not new, ("modules of one package that import each other (move the piece both need into a module "
                     f"both import, or pass a Protocol): {new}")
    untied = [sorted(c) for c in KNOWN if c not in found]
    assert not untied, f"circles untied or changed: take them out of KNOWN: {untied}"


def test_the_checker_finds_circles_through_function_and_type_only_imports(tmp_path: Path) -> None:
    package = tmp_path / "runs"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from openforge.runs.b import g\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\n"
                                  "if TYPE_CHECKING:\n    from openforge.runs import a\n")
    (package / "c.py").write_text("from .a import f\nimport openforge.runs.b\n")  # one way: no circle
    (package / "d.py").write_text("from openforge.runs.e import x\n")
    (package / "e.py").write_text("import openforge.runs.d\n")
    assert sorted(sorted(c) for c in folder_circles(package, "openforge.runs", tmp_path)) == [
        ["runs/a.py", "runs/b.py"], ["runs/d.py", "runs/e.py"]]
