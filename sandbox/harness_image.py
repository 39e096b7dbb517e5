"""The harness image: the python sandbox image plus npm harnesses (Claude Code, Codex, OpenClaw),
copied from a local npm install, so a harness runs inside a container exactly as it does from that
install in a local sandbox.

    layer = rollouts.npm.image_layer(["claude-code", "codex"], cache)   # what to copy
    tag = ensure_harness_image(layer)        # openforge-sandbox:claude-code-codex-<hash>

The recipe (`harness_recipe`) holds the python image's, every copied package's exact version, the
executables and the node version: a new release in the install gives a new tag, the same install
never rebuilds. The python rootfs tarball is copied member by member with the packages added (no
unpacking: no root needed, ownership exact), imported, and checked in a container as the sandbox's
user before it counts as built.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openforge.errors import SandboxError
from sandbox.images import (RECIPE_VERSION, REPOSITORY, SANDBOX_UID, build_rootfs_tar, image_tag, import_or_build,
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


def build_harness_tar(layer: NpmLayer, base: Path, out: Path) -> Path:
    """The python rootfs tarball `base`, plus the layer: its packages under /opt/forge/npm and links in
    /usr/local/bin. One pass over `base` (no unpacking: no root needed, ownership kept exactly)."""
    closure = npm_closure(layer.prefix, layer.packages)
    partial = out.with_suffix(".partial")
    with tarfile.open(base) as src, tarfile.open(partial, "w", format=tarfile.GNU_FORMAT) as tar:
        names: set[str] = set()
        for member in src:
            names.add(member.name.rstrip("/"))
            tar.addfile(member, src.extractfile(member) if member.isreg() else None)

        def add_dirs(path: str) -> None:  # the parents of `path` the tar does not have yet
            parts = path.split("/")
            for i in range(1, len(parts)):
                parent = "/".join(parts[:i])
                if parent not in names:
                    names.add(parent)
                    tar.addfile(_dir(parent))

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
