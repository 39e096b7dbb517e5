"""What this machine has, one verdict per item (ok / missing / warn): `forge doctor` prints them all, and
`runs.preflight` refuses a run whose config needs one that is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from openforge.config import DockerSandboxConfig, ForgeConfig, KubernetesSandboxConfig, SglangEngineConfig


@dataclass
class Check:
    name: str
    verdict: str  # ok | warn | missing
    detail: str


def _run(cmd: list[str], timeout: float = 10) -> tuple[int, str]:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, str(exc)
    return out.returncode, (out.stdout or out.stderr).strip()


def check_torch() -> list[Check]:
    try:
        import torch
    except ImportError as exc:
        return [Check("torch", "missing", f"cannot import torch ({exc}); run ./install.sh")]
    checks = [Check("torch", "ok", f"{torch.__version__}, {torch.get_num_threads()} CPU threads")]
    if torch.cuda.is_available():
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        checks.append(Check("GPU", "ok", names))
    else:
        smi = shutil.which("nvidia-smi")
        detail = "nvidia-smi present but torch is the CPU build" if smi else "none; the embedded CPU engine is used"
        checks.append(Check("GPU", "warn", detail))
    return checks


def check_docker(config: ForgeConfig) -> Check:
    from openforge.sandbox.docker_engine import probe

    docker_cfg = config.sandbox if isinstance(config.sandbox, DockerSandboxConfig) else DockerSandboxConfig()
    return Check("Docker engine", *probe(docker_cfg))


def check_kubernetes(config: ForgeConfig) -> Check:
    from openforge.sandbox.kubernetes import probe_cluster

    k8s = config.sandbox if isinstance(config.sandbox, KubernetesSandboxConfig) else KubernetesSandboxConfig()
    return Check("Kubernetes", *probe_cluster(k8s))


def check_sglang(config: ForgeConfig) -> Check:
    py = (config.engine if isinstance(config.engine, SglangEngineConfig) else SglangEngineConfig()).sglang_python
    code, out = _run([py, "-c", "import sglang; print(sglang.__version__)"], timeout=60)
    if code == 0:
        return Check("SGLang", "ok", f"{out.splitlines()[-1]} via {py}")
    return Check("SGLang", "missing", f"not importable by {py!r}; set engine.sglang_python to its venv (GPU only)")


def check_isolation() -> Check:
    from openforge.sandbox.local import describe_isolation  # the same probe the local backend decides by

    verdict, detail = describe_isolation()
    return Check("bubblewrap", verdict, detail)


def check_npm_harnesses(config: ForgeConfig, home: Path) -> list[Check]:
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        return [Check("node/npm", "missing", "needed for the claude-code and codex harnesses only")]
    _, version = _run([node, "--version"])
    checks = [Check("node/npm", "ok", f"node {version}")]
    cache = Path(config.harness.npm_cache or home / "npm")
    for name, binary in (("claude-code", "claude"), ("codex", "codex"), ("openclaw", "openclaw")):
        path = cache / "node_modules" / ".bin" / binary
        found = path if path.exists() else shutil.which(binary)
        if found:
            checks.append(Check(f"harness {name}", "ok", str(found)))
        else:
            # `forge up` refuses a harness that is not installed (preflight): say the command that installs it
            checks.append(Check(f"harness {name}", "warn", f"not installed in {cache}: run `forge harness install "
                                f"{name}` before using it"))
    return checks


def check_store(config: ForgeConfig, home: Path) -> Check:
    """The run store: the SQLite file, or the PostgreSQL server store.url names (reachable, the
    driver installed, the schema created or upgraded)."""
    from openforge.errors import StoreError
    from openforge.paths import db_path
    from openforge.store import STORE_URL_ENV, Store

    url = config.store.url or os.environ.get(STORE_URL_ENV, "")
    if not url:
        path = db_path(home)
        return Check("run store", "ok", f"SQLite file {path}" + ("" if path.exists() else " (made by the first run)"))
    try:
        store = Store(url)
    except StoreError as exc:
        return Check("run store", "missing", str(exc))
    try:
        return Check("run store", "ok", f"PostgreSQL {store.where}, schema version {store.schema_version()}")
    except StoreError as exc:
        return Check("run store", "missing", str(exc))
    finally:
        store.close()


def check_gui() -> Check:
    """Whether GUI rollouts (builtin-web, the GUI harnesses) can run in local sandboxes."""
    from openforge.sandbox.gui import find_chromium
    from openforge.sandbox.local import bwrap_usable

    found = {"chromium": find_chromium(), "Xvfb": shutil.which("Xvfb"), "xdotool": shutil.which("xdotool")}
    missing = [name for name, path in found.items() if not path]
    if missing:
        return Check("GUI rollouts", "warn", f"{', '.join(missing)} missing: GUI tasks (builtin-web) are refused "
                                             "(apt-get install chromium xvfb xdotool fonts-dejavu-core)")
    if not bwrap_usable():
        return Check("GUI rollouts", "warn", "chromium, Xvfb and xdotool found, but GUI tasks need bubblewrap "
                                             "isolation (a private display and site port)")
    return Check("GUI rollouts", "ok", f"{found['chromium']}, Xvfb, xdotool: local sandboxes get a private display")


def run_checks(config: ForgeConfig, home: Path) -> list[Check]:
    checks = check_torch()
    checks.append(check_store(config, home))
    checks.append(check_isolation())
    checks.append(check_docker(config))
    checks.append(check_kubernetes(config))
    checks.append(check_sglang(config))
    checks.extend(check_npm_harnesses(config, home))
    checks.append(check_gui())
    return checks
