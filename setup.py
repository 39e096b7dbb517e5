"""One installed namespace (issue 28): the repository's top-level folders install and import as
openforge.<folder> (openforge.proxy is proxy/, ...), so nothing collides with other distributions'
top-level names (PyPI's proxy.py imports as `proxy`). bench/ and tests/ are dev tools run from the
repository, never installed. Everything else about the package is in pyproject.toml."""

from setuptools import find_packages, setup

FOLDERS = ["engine", "proxy", "sandbox", "trainer", "runs", "rollouts", "integrations", "forge_cli"]

package_dir = {"openforge": "openforge"}
packages = ["openforge", "openforge.presets"]  # presets/: the TOML files load_config reads (package-data)
for folder in FOLDERS:
    for sub in ["", *find_packages(where=folder)]:
        name = f"openforge.{folder}" + (f".{sub}" if sub else "")
        packages.append(name)
    package_dir[f"openforge.{folder}"] = folder

setup(packages=packages, package_dir=package_dir)
