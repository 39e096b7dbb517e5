"""Every module has a findable test, and the tests keep the layout a reader looks in (issue 46).

The tests mirror the packages, and a module's test is where a reader looks for it: read statically (ast,
nothing imported), each module of the installed packages must be imported by name by a test file in its
mirrored folder, anywhere in that folder's subtree. The mirrored folder is tests/ plus the module's own
folder (tests/proxy/ for proxy/app.py, tests/rollouts/runner/ for rollouts/runner/grader.py,
tests/rollouts/tasks/harbor/ for rollouts/tasks/harbor/kind.py; openforge/'s own modules map to tests/core/),
cut back to the nearest folder tests/ has (tests/trainer/ for trainer/warmup/, tests/core/ for
openforge/presets/). So a test of rollouts/tasks/kinds.py may sit in tests/rollouts/tasks/ or in a family's
folder below it, but a test in tests/sandbox/ that happens to import it does not count, nor does one that
reaches a module only through another. tests/e2e/ (whole-product runs of `forge up`) mirrors no package:
its imports make no module findable.

Two kinds need no import of their own: a package `__init__` that only re-exports (docstring, imports,
`__all__`), and a `forge_cli/cmd_*.py` command module whose command a test in tests/forge_cli/ or tests/e2e/
runs through the CLI. Anything else without a test in its folder is in EXEMPT with the reason."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.helpers.paths import REPO, TESTS

PACKAGES = ["engine", "proxy", "sandbox", "trainer", "runs", "rollouts", "integrations", "forge_cli"]  # setup.py's
# Test files at the root of tests/ check the repository as a whole; every other test lives in a package folder.
ROOT_TESTS = {"test_layers.py", "test_docs_map.py", "test_every_module_has_a_test.py"}

EXEMPT = {
    "openforge.engine.__main__": "the `python -m openforge.engine` entry point EngineProcess launches: "
                                 "tests/engine/test_engine_supervisor.py starts, kills and restarts it",
    "openforge.rollouts.harnesses.browser_use_agent": "runs inside the sandbox and imports browser-use (absent "
                                                      "here): tests/rollouts/harnesses/test_gui_browser_use.py runs it",
    "openforge.integrations.verl.sft": "subclasses veRL's dataset (veRL absent here): tests/integrations/"
                                       "test_export_verl.py loads it by path through veRL's own loader",
    "openforge.proxy.workers": "the processes behind `proxy.workers = N`: tests/proxy/test_proxy_workers.py runs "
                               "two through ProxyServer, kills one and checks every answered call is recorded",
    "openforge.rollouts.runner.steps": "drives a multi-step rollout through the real runner: tests/rollouts/tasks/"
                                       "harbor/test_tasks_harbor_steps.py (one sandbox, each step graded, mean/final)",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) if parts[0] == "openforge" else "openforge." + ".".join(parts)


def _modules() -> dict[str, Path]:
    files = [p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")] + list((REPO / "openforge").rglob("*.py"))
    return {_module_name(p): p for p in sorted(files) if "node_modules" not in p.parts}


def _test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if "data" not in p.relative_to(TESTS).parts)


def _imported(tree: ast.AST, modules: dict[str, Path]) -> set[str]:
    """Modules a file names in an import: `import a.b`, `from a.b import x`, `from a import b` (b a module)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out |= {node.module} & modules.keys()
            out |= {f"{node.module}.{a.name}" for a in node.names} & modules.keys()
    return out


def _only_reexports(path: Path) -> bool:
    """A package __init__ with no logic: its docstring, imports and `__all__`, nothing else."""
    if path.name != "__init__.py":
        return False
    for stmt in ast.parse(path.read_text()).body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
            continue
        if isinstance(stmt, ast.Assign) and [getattr(t, "id", None) for t in stmt.targets] == ["__all__"]:
            continue
        return False
    return True


def _commands(path: Path) -> set[str]:
    """The commands a forge_cli/cmd_*.py module adds in register(): `app.command("x")`, `add_typer(..., name="x")`."""
    text = path.read_text()
    return set(re.findall(r'app\.command\("([\w-]+)"\)', text)) | set(re.findall(r'add_typer\([^)]*name="([\w-]+)"', text))


def _strings(tree: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def mirror(path: Path) -> Path:
    """The test folder of the module at `path`: tests/ + its folder (openforge/ -> core/), cut back to the
    nearest folder tests/ has."""
    folder = path.relative_to(REPO).parent.parts
    parts = ["core", *folder[1:]] if folder[0] == "openforge" else list(folder)
    while parts and not (TESTS.joinpath(*parts)).is_dir():
        parts.pop()
    return TESTS.joinpath(*parts)


# Tests that run the CLI as a user does: a command module's test may be here rather than in tests/forge_cli/.
CLI_FOLDERS = ("forge_cli", "e2e")


def _untested() -> dict[str, Path]:
    """The modules no test in their mirrored folder imports (re-exporting __init__s and CLI-run commands aside)."""
    modules = _modules()
    importers: dict[str, list[Path]] = {}
    cli_words: set[str] = set()
    for test in _test_files():
        text = test.read_text()
        tree = ast.parse(text)
        names = _imported(tree, modules)
        for name in names:
            importers.setdefault(name, []).append(test)
        # A file that drives the CLI (the Typer app, `python -m openforge.forge_cli.main`, or the helpers that
        # wrap them) runs the commands whose names it spells.
        drives_cli = "openforge.forge_cli.main" in names or "openforge.forge_cli.main" in text or \
            re.search(r"from tests\.helpers\.(up|cli) import", text)
        if drives_cli and test.relative_to(TESTS).parts[0] in CLI_FOLDERS:
            cli_words |= {s.split()[0] for s in _strings(tree) if s.strip()}
    untested = {}
    for name, path in modules.items():
        home = mirror(path)
        if any(t.is_relative_to(home) for t in importers.get(name, [])) or _only_reexports(path):
            continue
        if path.parent.name == "forge_cli" and path.name.startswith("cmd_") and _commands(path) & cli_words:
            continue
        untested[name] = path
    return untested


def test_every_module_is_imported_by_a_test_or_exempt_with_a_reason() -> None:
    missing = sorted(set(_untested()) - EXEMPT.keys())
    assert not missing, "module(s) no test in their mirrored folder imports (add a test of each module's own " \
                        "behaviour there, or move the file that tests it; where a direct test cannot run, an " \
                        "EXEMPT entry saying which test covers it):\n" + \
                        "\n".join(f"  {m} -> {mirror(_modules()[m]).relative_to(REPO)}/" for m in missing)


def test_the_exempt_list_names_only_untested_modules_that_exist() -> None:
    modules, untested = _modules(), _untested()
    assert not EXEMPT.keys() - modules.keys(), f"exempt modules that no longer exist: {EXEMPT.keys() - modules.keys()}"
    tested = sorted(m for m in EXEMPT if m not in untested)
    assert not tested, f"now imported by a test, so no longer exempt: {tested}"


def test_tests_live_in_package_folders() -> None:
    """A new test file goes where its module's tests are: a flat tests/test_x.py is refused, and every folder
    of tests is a package (tests/.../__init__.py), so two folders may hold files of the same name."""
    flat = sorted(p.name for p in TESTS.glob("test_*.py") if p.name not in ROOT_TESTS)
    assert not flat, f"test files at the root of tests/: {flat}; move each under tests/<package>/ (README, \"Tests\")"
    folders = {p.parent for p in _test_files()} | {p.parent for p in (TESTS / "helpers").glob("*.py")}
    chains = {d for f in folders for d in [f, *f.parents] if d == TESTS or TESTS in d.parents}
    no_init = sorted(str(d.relative_to(REPO)) for d in chains if not (d / "__init__.py").exists())
    assert not no_init, f"test folders without an __init__.py: {no_init}"


def test_the_checks_see_what_they_check() -> None:
    """The walk finds the modules and the imports it reasons about (a broken walk would pass everything)."""
    modules = _modules()
    assert {"openforge.proxy.app", "openforge.store", "openforge.rollouts.tasks.harbor.kind"} <= modules.keys()
    assert len(modules) > 200
    tree = ast.parse("import openforge.proxy.app\nfrom openforge.rollouts.tasks import kinds\n"
                     "from openforge.store import Store\nfrom . import x\n")
    assert _imported(tree, modules) == {"openforge.proxy.app", "openforge.rollouts.tasks", "openforge.rollouts.tasks.kinds",
                                        "openforge.store"}
    assert _only_reexports(REPO / "rollouts" / "tasks" / "arith" / "__init__.py")
    assert not _only_reexports(REPO / "proxy" / "app.py")
    assert {"gc", "sandbox"} <= _commands(REPO / "forge_cli" / "cmd_sandbox.py")
    assert mirror(REPO / "rollouts" / "tasks" / "harbor" / "kind.py") == TESTS / "rollouts" / "tasks" / "harbor"
    assert mirror(REPO / "openforge" / "store.py") == mirror(REPO / "openforge" / "presets" / "__init__.py") == TESTS / "core"
    assert mirror(REPO / "trainer" / "warmup" / "gui.py") == TESTS / "trainer"  # no tests/trainer/warmup/: the nearest
