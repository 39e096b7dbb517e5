"""Make the editable install readable by static tools (issue 46): `install.sh` runs this with the venv's
python after `pip install -e .`.

setup.py maps `openforge.<folder>` onto the repository's top-level folders. An editable install does that
at run time with an import hook (setuptools' finder), which Pyright, jedi and import-graph tools cannot
run: through it they resolve no `openforge.*` import. This builds, in the venv, a plain tree of links

    <venv>/openforge-links/openforge/config.py -> <repo>/openforge/config.py   (each entry of openforge/)
    <venv>/openforge-links/openforge/proxy     -> <repo>/proxy                 (each of setup.py's FOLDERS)

and a `.pth` line naming it, so the installed layout is the wheel's (`openforge/proxy/app.py`) to anyone
who reads paths. The folders are linked whole: a module added to one is seen at once. A module added to
openforge/ itself is seen after `./install.sh` runs again (tests/test_layers.py says so); until then
setuptools' hook, still installed, imports it.

    .venv/bin/python install_links.py
"""

from __future__ import annotations

import ast
import shutil
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parent
TREE_NAME = "openforge-links"


def folders() -> list[str]:
    """setup.py's FOLDERS: the folders installed as openforge.<folder> (read, not run: running setup.py builds)."""
    for node in ast.parse((REPO / "setup.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["FOLDERS"]:
            return list(ast.literal_eval(node.value))
    raise SystemExit("install_links.py: setup.py has no FOLDERS = [...]")


def build_tree(tree: Path) -> None:
    """`tree`/openforge: a link to each entry of the repository's openforge/ and to each folder."""
    partial = tree.with_name(tree.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    package = partial / "openforge"
    package.mkdir(parents=True)
    for entry in sorted((REPO / "openforge").iterdir()):
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    for folder in folders():
        if (package / folder).exists():
            raise SystemExit(f"install_links.py: openforge/{folder} exists and is also a folder in setup.py")
        (package / folder).symlink_to(REPO / folder, target_is_directory=True)
    shutil.rmtree(tree, ignore_errors=True)
    partial.rename(tree)


def main() -> None:
    tree = Path(sys.prefix) / TREE_NAME
    build_tree(tree)
    # A .pth line that is a path puts it on sys.path: static tools read these as they read site-packages.
    (Path(sysconfig.get_paths()["purelib"]) / f"{TREE_NAME}.pth").write_text(f"{tree}\n", encoding="utf-8")


if __name__ == "__main__":
    main()
