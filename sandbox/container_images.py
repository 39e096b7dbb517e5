"""Sandbox images, built locally: no registry is needed (or reachable) to get a working image.

Three variants, each tagged by a hash of its recipe so a changed recipe gives a new tag and an
unchanged one is never rebuilt (`ensure_image` returns at once when the tag exists):

    python   Debian bookworm minbase (debootstrap) + python3 + the `openai` SDK, so the Python `mini`
             harness runs unchanged inside a container. ~1-3 minutes the first time, needs root.
    busybox  the host's static busybox and its applet links: a shell-only image in ~1 s, for tests.
    browser  the python image + Debian's chromium, Xvfb, xdotool, fonts and python3-pil: GUI rollouts
             (screenshots and input inside the container, sandbox/gui.py). ~5 minutes the first time.
    desktop  the python image + Xvfb, xdotool, fonts, python3-pil and the Debian packages a desktop task's
             applications come in (`--packages libreoffice-calc,vlc`): desktop tasks (rollouts/tasks/
             desktop.py) in containers. No browser. Its tag hashes the package list too.
    harness  the python image + npm harnesses (Claude Code, Codex, OpenClaw) copied from a local npm
             install: sandbox/harness_image.py.

Every image has the sandbox's user, `forge` (uid/gid 1000, as the Kubernetes pods): it owns
`/workspace` and `/home/forge` and nothing else, so a container run as it with a read-only root can
write only there (and `/tmp`).

The rootfs tarball is kept in a cache folder as well, so a fresh Docker data dir (CI) re-imports it in
seconds instead of bootstrapping again.

    forge sandbox build-image --variant python      # also tags openforge-sandbox:latest
    forge sandbox build-image --harness claude-code,codex
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from openforge.environment import forge_env
from openforge.errors import SandboxError
from openforge.sandbox.docker_engine import connect

REPOSITORY = "openforge-sandbox"
RECIPE_VERSION = 2  # bump when the build steps below change in a way the recipe dict does not show
SANDBOX_UID = 1000  # the `forge` user every image has and containers run as (sandbox.docker, k8s pods)
SANDBOX_USER = "forge"  # its name (local sandboxes under bubblewrap run as it too: sandbox/local.py)
SANDBOX_HOME = "/home/forge"
WORKDIR = "workspace"
SUITE = "bookworm"
APT_PACKAGES = ("python3", "ca-certificates")
PIP_PACKAGES = ("openai>=2,<4",)
# The browser variant's additions: a browser, a display, input, fonts, and Pillow (its ImageGrab takes
# the screenshots; Debian builds it with XCB).
BROWSER_PACKAGES = ("chromium", "xvfb", "xdotool", "fonts-dejavu-core", "python3-pil")
BROWSER_CHECK = ["sh", "-c", "cd /tmp && chromium --headless --no-sandbox --disable-gpu --user-data-dir=/tmp/p "
                 "--screenshot=/tmp/s.png --window-size=320,240 'data:text/html,<h1>ok</h1>' && test -s /tmp/s.png "
                 "&& command -v Xvfb xdotool >/dev/null && python3 -c 'from PIL import ImageGrab'"]
# The desktop variant's additions: a bare display (Xvfb brings xkbcomp), input, fonts, screenshots; the
# applications are the user's packages on top (DESKTOP_CHECK reads nothing of them: a task's own probe does).
DESKTOP_PACKAGES = ("xvfb", "xdotool", "fonts-dejavu-core", "python3-pil")
DESKTOP_CHECK = ["sh", "-c", "command -v Xvfb xkbcomp xdotool >/dev/null && python3 -c 'from PIL import ImageGrab'"]
_DEBIAN_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")  # Debian policy 5.6.1
# debootstrap leaves these behind; nothing in a sandbox reads them.
_PRUNE = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/locale")


def recipe(variant: str, packages: tuple[str, ...] = ()) -> dict[str, Any]:
    """The variant's recipe; `packages` (Debian package names) only for the desktop variant."""
    if packages and variant != "desktop":
        raise SandboxError(f"extra packages go on the desktop variant only, not {variant!r}")
    if variant in ("python", "browser", "desktop"):
        return {"v": RECIPE_VERSION, "variant": variant, "suite": SUITE, "apt": _apt(variant, packages),
                "pip": PIP_PACKAGES, "arch": platform.machine()}
    if variant == "busybox":
        return {"v": RECIPE_VERSION, "variant": variant, "arch": platform.machine()}
    raise SandboxError(f"unknown image variant {variant!r}; choose python, browser, desktop or busybox "
                       "(or --harness NAMES)")


def _apt(variant: str, packages: tuple[str, ...] = ()) -> tuple[str, ...]:
    if variant == "browser":
        return APT_PACKAGES + BROWSER_PACKAGES
    if variant == "desktop":
        bad = [p for p in packages if not _DEBIAN_PACKAGE.match(p)]
        if bad:
            raise SandboxError(f"not a Debian package name: {', '.join(map(repr, bad))}")
        extra = sorted(set(packages) - set(APT_PACKAGES + DESKTOP_PACKAGES))  # one tag per set, in any order
        return APT_PACKAGES + DESKTOP_PACKAGES + tuple(extra)
    return APT_PACKAGES


def recipe_digest(spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def image_tag(variant: str, packages: tuple[str, ...] = ()) -> str:
    return f"{REPOSITORY}:{variant}-{recipe_digest(recipe(variant, packages))}"


def cache_dir() -> Path:
    base = forge_env("FORGE_IMAGE_CACHE") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "openforge" / "images"
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _run(cmd: list[str], what: str, timeout: float, **kw: Any) -> None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except FileNotFoundError:
        raise SandboxError(f"{what}: {cmd[0]} not found (apt-get install {cmd[0]})") from None
    except subprocess.TimeoutExpired:
        raise SandboxError(f"{what}: gave up after {timeout:.0f}s") from None
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
        raise SandboxError(f"{what} failed (exit {out.returncode}): {' | '.join(tail)}")


def _busybox_rootfs(root: Path) -> None:
    busybox = shutil.which("busybox")
    if not busybox:
        raise SandboxError("the busybox image needs a static busybox on the host (apt-get install busybox-static)")
    listing = subprocess.run([busybox, "--list"], capture_output=True, text=True, timeout=10)
    (root / "bin").mkdir(parents=True)
    shutil.copy2(busybox, root / "bin" / "busybox")
    for applet in listing.stdout.split():
        if applet != "busybox":
            (root / "bin" / applet).symlink_to("busybox")
    for d in ("tmp", "etc", WORKDIR, "root"):
        (root / d).mkdir(exist_ok=True)
    (root / "tmp").chmod(0o1777)
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc" / "group").write_text("root:x:0:\n")
    _add_user(root)


def user_entries(home: str) -> tuple[str, str]:
    """The sandbox's user as an /etc/passwd and an /etc/group line (images and local sandboxes alike)."""
    return (f"{SANDBOX_USER}:x:{SANDBOX_UID}:{SANDBOX_UID}:{SANDBOX_USER}:{home}:/bin/sh\n",
            f"{SANDBOX_USER}:x:{SANDBOX_UID}:\n")


def _add_user(root: Path) -> None:
    """The sandbox's user in /etc/passwd and /etc/group (a program asking getpwuid() gets an answer) and
    its home; `_pack` gives it `WORKDIR` and the home."""
    passwd, group = user_entries(SANDBOX_HOME)
    with open(root / "etc" / "passwd", "a") as f:
        f.write(passwd)
    with open(root / "etc" / "group", "a") as f:
        f.write(group)
    (root / SANDBOX_HOME.lstrip("/")).mkdir(parents=True, exist_ok=True)


def _python_rootfs(root: Path, timeout: float, apt: tuple[str, ...] = APT_PACKAGES) -> None:
    if os.geteuid() != 0:
        raise SandboxError("building the python image runs debootstrap, which needs root (sudo forge sandbox build-image)")
    mirror = forge_env("FORGE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
    base, extra = [p for p in apt if p in APT_PACKAGES], [p for p in apt if p not in APT_PACKAGES]
    _run(["debootstrap", "--variant=minbase", f"--include={','.join(base)}", SUITE, str(root), mirror],
         "debootstrap", timeout)
    if extra:  # debootstrap's own resolver fails on chromium's dependencies (dconf-service): apt does it
        _apt_install(root, extra, timeout)
    pythons = sorted(p.name for p in (root / "usr" / "lib").glob("python3.*") if p.is_dir())
    if not pythons:
        raise SandboxError("debootstrap finished but the rootfs has no python3")
    version = pythons[-1].removeprefix("python")
    # The host's pip installs wheels for the image's Python into the image's dist-packages, so the
    # image needs no pip of its own (Debian's python3-pip would add ~40 MB and PEP 668 friction).
    arch = platform.machine()
    # pip does not expand one manylinux tag to the older ones: name each glibc level wheels use.
    platforms = [f"--platform={tag}_{arch}" for tag in ("manylinux_2_36", "manylinux_2_28", "manylinux_2_17",
                                                         "manylinux2014")]
    target = root / "usr" / "local" / "lib" / f"python{version}" / "dist-packages"
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-compile",
          "--target", str(target), "--only-binary=:all:", "--implementation", "cp",
          "--python-version", version, *platforms, *PIP_PACKAGES],
         "pip install into the image", timeout)
    for rel in _PRUNE:
        shutil.rmtree(root / rel, ignore_errors=True)
    (root / WORKDIR).mkdir(exist_ok=True)
    _add_user(root)


def _apt_install(root: Path, packages: list[str], timeout: float) -> None:
    """apt-get install (no recommends) in the bootstrapped root, with its own /proc for the packages'
    scripts and the host's resolv.conf to reach the mirror; no service is started (policy-rc.d)."""
    policy = root / "usr" / "sbin" / "policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    shutil.copy2("/etc/resolv.conf", root / "etc" / "resolv.conf")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive", "LANG": "C.UTF-8"}
    _run(["mount", "-t", "proc", "proc", str(root / "proc")], "mounting /proc for apt", 30)
    try:
        _run(["chroot", str(root), "apt-get", "update", "-qq"], "apt-get update in the image", timeout, env=env)
        _run(["chroot", str(root), "apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
             "apt-get install in the image", timeout, env=env)
        _run(["chroot", str(root), "apt-get", "clean"], "apt-get clean in the image", 120, env=env)
    finally:
        subprocess.run(["umount", "-l", str(root / "proc")], capture_output=True, timeout=30)
        policy.unlink(missing_ok=True)
        (root / "etc" / "resolv.conf").unlink(missing_ok=True)


def _owner(info: tarfile.TarInfo, *, keep_owner: bool) -> tarfile.TarInfo:
    """Numeric ownership as the image wants it: the user's folders are the user's, the rest root's
    (busybox: whoever built it) or as debootstrap left it (python: a few system groups)."""
    if info.name in (WORKDIR, SANDBOX_HOME.lstrip("/")):
        info.uid = info.gid = SANDBOX_UID
    elif not keep_owner:
        info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _pack(root: Path, out: Path, *, keep_owner: bool) -> None:
    with tarfile.open(out, "w", format=tarfile.GNU_FORMAT) as tar:
        for child in sorted(root.iterdir()):
            tar.add(child, arcname=child.name, filter=lambda info: _owner(info, keep_owner=keep_owner))


def build_rootfs_tar(variant: str, out: Path, *, timeout: float = 600, packages: tuple[str, ...] = ()) -> Path:
    """Make the variant's rootfs and pack it into `out` (a tar a `docker import` accepts)."""
    with tempfile.TemporaryDirectory(prefix=f"openforge-{variant}-", dir=out.parent) as tmp:
        root = Path(tmp) / "rootfs"
        if variant == "busybox":
            _busybox_rootfs(root)
        else:
            _python_rootfs(root, timeout, _apt(variant, packages))
        partial = Path(tmp) / out.name  # this build's own: two builds of one image never share it
        _pack(root, partial, keep_owner=variant != "busybox")
        partial.replace(out)  # atomic: a crash mid-build never leaves a half tarball under the real name
    return out


def has_image(client: Any, tag: str) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def tarball_path(tag: str) -> Path:
    return cache_dir() / f"{tag.replace(':', '_')}.tar"


def import_or_build(tag: str, build: Callable[[Path], Any], *, base_url: str, timeout: float, tag_latest: bool,
            check: list[str] | None = None) -> str:
    """`tag` on the engine: imported from its cached tarball, built first by `build(tarball)` if there is
    none. `check`: a command a fresh container of the new image must pass (as the sandbox's user, no
    network) before the image counts as built; if it fails, image and tarball are removed."""
    import docker.errors

    client = connect(base_url, timeout=max(timeout, 60))  # an import of ~1 GB outlasts the default 30 s
    try:
        if not has_image(client, tag):
            tarball = tarball_path(tag)
            if not tarball.exists():
                build(tarball)
            repo, _, name = tag.partition(":")
            try:
                client.api.import_image_from_file(str(tarball), repository=repo, tag=name)
            except docker.errors.APIError as exc:
                tarball.unlink(missing_ok=True)  # the next try builds it again instead of failing the same way
                raise SandboxError(f"docker import of {tarball} failed: {exc.explanation or exc}") from None
            if not has_image(client, tag):
                raise SandboxError(f"docker import of {tarball} did not produce {tag}")
            if check:
                _check_image(client, tag, check, tarball)
        if tag_latest:
            client.images.get(tag).tag(REPOSITORY, "latest")
    finally:
        client.close()
    return tag


def _check_image(client: Any, tag: str, command: list[str], tarball: Path) -> None:
    import docker.errors

    try:
        client.containers.run(tag, command, remove=True, user=f"{SANDBOX_UID}:{SANDBOX_UID}", network_mode="none",
                              stdout=True, stderr=True)
    except docker.errors.ContainerError as exc:
        client.images.remove(tag, force=True)
        tarball.unlink(missing_ok=True)
        err = exc.stderr.decode(errors="replace").strip().splitlines()[-1:] if exc.stderr else []
        raise SandboxError(f"the new image {tag} fails its check `{' '.join(command)}` "
                           f"(exit {exc.exit_status}: {' '.join(err) or 'no output'}); removed it") from None


def ensure_image(variant: str = "python", *, base_url: str = "", timeout: float = 600,
                 tag_latest: bool = False, packages: tuple[str, ...] = ()) -> str:
    """The variant's image tag, building and importing it first if the engine lacks it."""
    checks = {"browser": BROWSER_CHECK, "desktop": DESKTOP_CHECK}
    return import_or_build(image_tag(variant, packages),
                           lambda out: build_rootfs_tar(variant, out, timeout=timeout, packages=packages),
                           base_url=base_url, timeout=timeout, tag_latest=tag_latest, check=checks.get(variant))
