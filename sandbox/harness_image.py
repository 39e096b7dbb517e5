"""The harness image: the python sandbox image plus npm harnesses (Claude Code, Codex, OpenClaw),
copied from a local npm install, so a harness runs inside a container exactly as it does from that
install in a local sandbox.

    layer = harnesses.npm.image_layer({"claude-code": ..., "codex": ...}, cache)   # what to copy (each its NpmHarness)
    tag = ensure_harness_image(layer)        # openforge-sandbox:claude-code-codex-<hash>

The recipe (`harness_recipe`) holds the python image's, every copied package's exact version, the
executables and the node version: a new release in the install gives a new tag, the same install
never rebuilds. The python rootfs tarball is copied member by member with the packages added (no
unpacking: no root needed, ownership exact), imported, and checked in a container as the sandbox's
user before it counts as built.

browser-use (a Python harness, `forge harness install browser-use`) is the same idea on the *browser*
image: its venv's site-packages, copied as they are, become a venv over the image's own python3 at
/opt/forge/browser-use (`ensure_venv_image`, tag `openforge-sandbox:browser-use-<hash>`), checked by
importing it and every compiled module of the venv in a container as the sandbox's user.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openforge.errors import SandboxError
from openforge.sandbox.container_images import (RECIPE_VERSION, REPOSITORY, SANDBOX_UID, build_rootfs_tar, image_tag, import_or_build,
                            recipe, recipe_digest, tarball_path)

NPM_PREFIX = "opt/forge/npm"  # where the packages go in the image


@dataclass(frozen=True)
class NpmLayer:
    """What the harness variant adds to the python image (rollouts.npm.image_layer builds one).

    `prefix` is a local npm install (`<prefix>/node_modules/...`); `packages` the top-level packages
    to copy, with everything they depend on as Node resolves it; `bins` the executables put on the
    PATH (`/usr/local/bin/<name>` -> a path relative to `prefix`); `node` a Node binary for
    `/usr/local/bin/node` (inside `prefix`: linked, else copied; None: no node)."""

    names: tuple[str, ...]  # the harnesses, for the tag
    prefix: Path
    packages: tuple[str, ...]
    bins: dict[str, str] = field(default_factory=dict)
    node: Path | None = None


def _find_package(prefix: Path, start: Path, name: str) -> Path | None:
    """The folder `require(name)` from `start` finds: node_modules/<name> in `start`, then its parents."""
    here = start
    while True:
        candidate = here / "node_modules" / name
        if (candidate / "package.json").is_file():
            return candidate
        if here == prefix or prefix not in here.parents:
            return None
        here = here.parent


def npm_closure(prefix: Path, packages: Iterable[str]) -> dict[str, str]:
    """{folder relative to prefix: version} of `packages` and all they depend on (optional ones that npm
    did not install, for other platforms, are skipped)."""
    found: dict[str, str] = {}
    todo = [(prefix, name) for name in packages]
    while todo:
        start, name = todo.pop()
        folder = _find_package(prefix, start, name)
        if folder is None:
            if start == prefix:
                raise SandboxError(f"{name} is not installed in {prefix}")
            continue
        rel = folder.relative_to(prefix).as_posix()
        if rel in found:
            continue
        meta = json.loads((folder / "package.json").read_text())
        found[rel] = str(meta.get("version", "?"))
        todo += [(folder, dep) for dep in {**meta.get("dependencies", {}), **meta.get("optionalDependencies", {})}]
    return found


def _node_version(node: Path) -> str:
    try:
        out = subprocess.run([str(node), "--version"], capture_output=True, text=True, timeout=60)
    except OSError as exc:
        raise SandboxError(f"cannot run {node}: {exc}") from None
    return out.stdout.strip() or f"exit {out.returncode}"


def harness_recipe(layer: NpmLayer) -> dict[str, Any]:
    """The harness image's recipe: the python image's, every copied package's exact version, the
    executables, the node version. A new package version in the install gives a new tag."""
    return {"v": RECIPE_VERSION, "variant": "harness", "base": recipe("python"),
            "packages": npm_closure(layer.prefix, layer.packages), "bins": dict(sorted(layer.bins.items())),
            "node": _node_version(layer.node) if layer.node else None, "uid": SANDBOX_UID}


def harness_tag(layer: NpmLayer) -> str:
    return f"{REPOSITORY}:{'-'.join(layer.names)}-{recipe_digest(harness_recipe(layer))}"


def _readable(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Root-owned, readable (and where executable, runnable) by the sandbox's user."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode |= 0o044
    if info.isdir() or info.mode & 0o100:
        info.mode |= 0o011
    return info


def _dir(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, 0o755
    return info


def _copy_base(src: tarfile.TarFile, tar: tarfile.TarFile) -> set[str]:
    """Every member of `src` into `tar` as it is; the names copied."""
    names: set[str] = set()
    for member in src:
        names.add(member.name.rstrip("/"))
        tar.addfile(member, src.extractfile(member) if member.isreg() else None)
    return names


def _add_parents(tar: tarfile.TarFile, names: set[str], path: str) -> None:
    """The parent folders of `path` that the tar does not have yet."""
    parts = path.split("/")
    for i in range(1, len(parts)):
        parent = "/".join(parts[:i])
        if parent not in names:
            names.add(parent)
            tar.addfile(_dir(parent))


def build_harness_tar(layer: NpmLayer, base: Path, out: Path) -> Path:
    """The python rootfs tarball `base`, plus the layer: its packages under /opt/forge/npm and links in
    /usr/local/bin. One pass over `base` (no unpacking: no root needed, ownership kept exactly)."""
    closure = npm_closure(layer.prefix, layer.packages)
    partial = out.with_name(f"{out.name}.{os.getpid()}.partial")  # this build's own
    with tarfile.open(base) as src, tarfile.open(partial, "w", format=tarfile.GNU_FORMAT) as tar:
        names = _copy_base(src, tar)

        def add_dirs(path: str) -> None:
            _add_parents(tar, names, path)

        def package_member(info: tarfile.TarInfo, top: str) -> tarfile.TarInfo | None:
            # A package's own node_modules holds other packages: those in the closure come as their own.
            rest = info.name[len(top):]
            if rest == "/node_modules" or rest.startswith("/node_modules/"):
                return None
            names.add(info.name)
            return _readable(info)

        for rel in sorted(closure):
            arc = f"{NPM_PREFIX}/{rel}"
            add_dirs(arc)
            tar.add(layer.prefix / rel, arcname=arc, filter=lambda info, top=arc: package_member(info, top))
        links = {f"usr/local/bin/{name}": f"/{NPM_PREFIX}/{rel}" for name, rel in layer.bins.items()}
        if layer.node is not None:
            inside = layer.prefix in layer.node.parents
            if inside:
                links["usr/local/bin/node"] = f"/{NPM_PREFIX}/{layer.node.relative_to(layer.prefix).as_posix()}"
            else:
                add_dirs("usr/local/bin/node")
                tar.add(layer.node, arcname="usr/local/bin/node", filter=_readable)
        for link, target in links.items():
            add_dirs(link)
            info = tarfile.TarInfo(link)
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
            tar.addfile(info)
    partial.replace(out)
    return out


def ensure_harness_image(layer: NpmLayer, *, base_url: str = "", timeout: float = 900,
                         tag_latest: bool = False) -> str:
    """The harness image's tag, building it on the python image's tarball (built first if needed)."""
    base_tag = image_tag("python")

    def build(out: Path) -> None:
        base = tarball_path(base_tag)
        if not base.exists():
            build_rootfs_tar("python", base, timeout=timeout)
        build_harness_tar(layer, base, out)
        # ~1 GB each: keep only the newest tarball of these harnesses (older versions' images stay imported).
        for old in out.parent.glob(f"{REPOSITORY}_{'-'.join(layer.names)}-*.tar"):
            if old != out:
                old.unlink(missing_ok=True)

    check = " && ".join(f"{name} --version" for name in ["node"] * (layer.node is not None) + sorted(layer.bins))
    return import_or_build(harness_tag(layer), build, base_url=base_url, timeout=timeout, tag_latest=tag_latest,
                   check=["sh", "-c", check] if check else None)


# -- a Python harness (browser-use) on the browser image ---------------------------------------------

# The image's check, /<prefix>/forge-check.py, run by the venv's python3 as the sandbox's user with no
# network: every module in forge-check.json imports, from the venv. A module that needs a part of the
# standard library the image's python lacks (Debian ships tkinter apart, in python3-tk) is reported, not
# failed: the check is about the compiled wheels loading on the image's python and glibc.
VENV_CHECK = r"""
import importlib, json, os, sys
if len(sys.argv) == 3:  # run from elsewhere: the venv, the spec
    prefix, spec_path = sys.argv[1:3]
else:
    prefix = os.path.dirname(os.path.abspath(__file__))
    spec_path = os.path.join(prefix, "forge-check.json")
with open(spec_path) as f:
    spec = json.load(f)
got = "%d.%d" % sys.version_info[:2]
if got != spec["python"]:
    sys.exit(f"the image's python3 is {got}; the venv was made with {spec['python']}")
failed, skipped = [], []
for name in spec["modules"]:
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        top = (exc.name or "").partition(".")[0]
        (skipped if top in sys.stdlib_module_names else failed).append(f"{name}: no {exc.name}")
        continue
    except Exception as exc:  # an ImportError, or an OSError from a shared library
        failed.append(f"{name}: {type(exc).__name__}: {exc}"[:300])
        continue
    where = getattr(module, "__file__", None) or ""
    if not where.startswith(prefix + "/"):
        failed.append(f"{name}: loaded from {where or 'nowhere'}, not from {prefix}")
for line in failed:
    print("FAILED " + line, file=sys.stderr)
for line in skipped:
    print("SKIPPED (the image's python lacks that part of the standard library) " + line, file=sys.stderr)
loaded = len(spec["modules"]) - len(failed) - len(skipped)
print(f"{loaded} of {len(spec['modules'])} modules load; " + (f"failed: {failed[0]}" if failed else "ok"), file=sys.stderr)
sys.exit(1 if failed else 0)
"""


@dataclass(frozen=True)
class VenvLayer:
    """A local venv's site-packages for an image (rollouts.harnesses.browseruse.image_layer builds one).

    In the image they become a venv over the image's own python3, at `/<prefix>`: `pyvenv.cfg`,
    `bin/python3 -> /usr/bin/python3` and `lib/pythonX.Y/site-packages` copied file for file, so the
    harness sees exactly the versions it was installed with, and none of the image's own
    dist-packages (the python image's openai and pydantic, other versions)."""

    name: str  # the tag's name: openforge-sandbox:<name>-<hash>
    venv: Path
    python: str  # the venv's major.minor; the image's python3 must be the same
    imports: tuple[str, ...]  # what the image's check imports besides every compiled module
    base: str = "browser"  # the image variant it goes on
    prefix: str = "opt/forge/venv"
    scripts: tuple[str, ...] = ()  # the venv's console scripts to put on the PATH (/usr/local/bin)

    @property
    def site_packages(self) -> Path:
        return self.venv / "lib" / f"python{self.python}" / "site-packages"

    @property
    def interpreter(self) -> str:
        """The path of the venv's python3 inside the image."""
        return f"/{self.prefix}/bin/python3"


def venv_distributions(site_packages: Path) -> dict[str, str]:
    """{distribution name: version} of every distribution installed in `site_packages`."""
    import importlib.metadata as md

    found = {dist.metadata["Name"].lower().replace("_", "-"): dist.version
             for dist in md.distributions(path=[str(site_packages)]) if dist.metadata["Name"]}
    return dict(sorted(found.items()))


def venv_recipe(layer: VenvLayer) -> dict[str, Any]:
    """The image's recipe: the base image's, every installed distribution's exact version, the python,
    where it goes. The same install never rebuilds; any new version in it gives a new tag."""
    return {"v": RECIPE_VERSION, "variant": layer.name, "base": recipe(layer.base), "python": layer.python,
            "packages": venv_distributions(layer.site_packages), "prefix": layer.prefix, "uid": SANDBOX_UID,
            **({"scripts": list(layer.scripts)} if layer.scripts else {})}


def venv_tag(layer: VenvLayer) -> str:
    return f"{REPOSITORY}:{layer.name}-{recipe_digest(venv_recipe(layer))}"


def compiled_modules(site_packages: Path) -> list[str]:
    """The import names of the extension modules in `site_packages` (shared libraries that wheels vendor
    in `<name>.libs/` folders are not modules)."""
    import importlib.machinery

    suffixes = sorted(importlib.machinery.EXTENSION_SUFFIXES, key=len, reverse=True)
    found = []
    for path in sorted(site_packages.rglob("*.so")):
        rel = path.relative_to(site_packages).as_posix()
        suffix = next((s for s in suffixes if rel.endswith(s)), None)
        if suffix is None:
            continue
        name = rel[: -len(suffix)].replace("/", ".")
        if all(part.isidentifier() for part in name.split(".")):
            found.append(name)
    return found


def _run_check(layer: VenvLayer, modules: list[str]) -> list[str]:
    """VENV_CHECK run by the local venv's python on `modules`: the lines it wrote."""
    import tempfile

    # browser-use makes ~/.config/browseruse and, in $TMPDIR, a downloads folder it never removes
    with tempfile.TemporaryDirectory(prefix="forge-venv-check-") as tmp:
        spec = Path(tmp) / "forge-check.json"
        spec.write_text(json.dumps({"python": layer.python, "modules": modules}))
        python = str(layer.venv / "bin" / "python")
        try:  # the venv's own path, unresolved: the modules' __file__ start with it, as sys.path does
            out = subprocess.run([python, "-c", VENV_CHECK, str(layer.venv), str(spec)], capture_output=True,
                                 text=True, timeout=300, cwd=tmp, env={"PATH": "/usr/bin:/bin", "HOME": tmp, "TMPDIR": tmp})
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxError(f"cannot run {python}: {exc}") from None
    return out.stderr.splitlines()


def host_loadable(layer: VenvLayer) -> list[str]:
    """What the image's check imports: the layer's `imports` (each must load here) and the compiled
    modules that load from the venv on this machine (what does not load here is not asked of the image)."""
    lines = _run_check(layer, list(layer.imports))
    if not lines or not lines[-1].endswith("; ok"):
        raise SandboxError(f"the venv {layer.venv} does not import {', '.join(layer.imports)}: "
                           f"{lines[-1] if lines else 'no output'}")
    compiled = compiled_modules(layer.site_packages)
    bad = {line.split()[1].rstrip(":") for line in _run_check(layer, compiled) if line.startswith("FAILED ")}
    return [*layer.imports, *(name for name in compiled if name not in bad)]


def build_venv_tar(layer: VenvLayer, base: Path, out: Path, modules: list[str]) -> Path:
    """The base image's rootfs tarball plus the venv at /<prefix>: its site-packages as they are (the
    compiled bytecode included: its sources keep their mtimes, so the image's read-only root never
    recompiles), pyvenv.cfg, bin/python3 -> /usr/bin/python3, and the check (forge-check.py: `modules`
    must import). One pass over `base`."""
    site = f"{layer.prefix}/lib/python{layer.python}/site-packages"
    partial = out.with_name(f"{out.name}.{os.getpid()}.partial")  # this build's own
    with tarfile.open(base) as src, tarfile.open(partial, "w", format=tarfile.GNU_FORMAT) as tar:
        names = _copy_base(src, tar)
        _add_parents(tar, names, f"{layer.prefix}/bin/python3")
        _add_parents(tar, names, site)  # site itself comes with its files, below
        files = {"pyvenv.cfg": f"home = /usr/bin\ninclude-system-site-packages = false\nversion = {layer.python}\n",
                 "forge-check.py": VENV_CHECK,
                 "forge-check.json": json.dumps({"python": layer.python, "modules": modules}, indent=0)}
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{layer.prefix}/{name}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        links = {f"{layer.prefix}/bin/python3": "/usr/bin/python3", f"{layer.prefix}/bin/python": "python3"}
        for script in layer.scripts:  # its shebang names the local venv's python: the image's instead
            lines = (layer.venv / "bin" / script).read_bytes().split(b"\n", 1)
            data = b"#!/" + layer.interpreter.lstrip("/").encode() + b"\n" + (lines[1] if len(lines) > 1 else b"")
            info = tarfile.TarInfo(f"{layer.prefix}/bin/{script}")
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
            links[f"usr/local/bin/{script}"] = f"/{layer.prefix}/bin/{script}"
            _add_parents(tar, names, f"usr/local/bin/{script}")
        for path, target in links.items():
            info = tarfile.TarInfo(path)
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
            tar.addfile(info)
        tar.add(layer.site_packages, arcname=site, filter=_readable)
    partial.replace(out)
    return out


def ensure_venv_image(layer: VenvLayer, *, base_url: str = "", timeout: float = 900, tag_latest: bool = False) -> str:
    """The layer's image tag, building it on the base image's cached rootfs tarball (built first if there
    is none: the browser image's takes ~10 minutes). It counts as built once, in a container as the
    sandbox's user with no network, the venv's python3 imports `layer.imports` and every compiled module
    that loads here, each from the venv."""
    def build(out: Path) -> None:
        modules = host_loadable(layer)
        base = tarball_path(image_tag(layer.base))
        if not base.exists():
            build_rootfs_tar(layer.base, base, timeout=timeout)
        build_venv_tar(layer, base, out, modules)
        for old in out.parent.glob(f"{REPOSITORY}_{layer.name}-*.tar"):  # ~1.2 GB each: keep the newest
            if old != out:
                old.unlink(missing_ok=True)

    check = [layer.interpreter, f"/{layer.prefix}/forge-check.py"]
    if layer.scripts:  # and its programs are on the PATH
        check = ["sh", "-c", " && ".join([" ".join(check), *(f"command -v {s}" for s in layer.scripts)])]
    return import_or_build(venv_tag(layer), build, base_url=base_url, timeout=timeout, tag_latest=tag_latest,
                           check=check)
