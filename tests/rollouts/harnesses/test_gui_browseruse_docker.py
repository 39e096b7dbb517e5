"""browser-use inside containers: the browser-use image (`forge sandbox build-image --harness browser-use`,
sandbox/harness_image.py's venv layer) is the browser image plus the harness cache's browser-use venv,
as a venv over the image's own python3 at /opt/forge/browser-use; a real browser-use rollout runs in a
Docker container of it through the runner, against the recording proxy, graded by the site's state.

Skipped, with the reason, without a Docker engine, without browser-use in the harness cache, or (when the
engine lacks the browser-use image) without the browser image's cached rootfs tarball to build it on
(building that is ~10 minutes: not a test's job).
The browser-use image itself is built here if the engine lacks it (from the cached browser tarball:
~1.5 min under load; an import of its own cached tarball when there is one)."""

from __future__ import annotations

import json
import os
import re
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from openforge.config import DockerSandboxConfig, HarnessConfig
from openforge.errors import HarnessError, SandboxError
from openforge.store import Store
from openforge.rollouts.harnesses.browseruse import IMAGE_PREFIX, IMAGE_PYTHON, image_layer, venv_python
from openforge.sandbox.harness_image import (VenvLayer, build_venv_tar, compiled_modules, venv_distributions, venv_recipe,
                                   venv_tag)
from openforge.sandbox.container_images import SANDBOX_UID, build_rootfs_tar
from tests.helpers.required import skip_or_fail

CACHE = Path(os.environ.get("FORGE_NPM_CACHE") or Path.home() / ".cache" / "openforge-npm").expanduser()

pytestmark = pytest.mark.timeout(600)


# -- the layer, on a hand-made venv ------------------------------------------------------------------

def fake_venv(root: Path, dists: dict[str, str]) -> Path:
    """A venv as `python -m venv` + pip lay it out: distributions with their dist-info, a package, a
    compiled module's file, a vendored shared library, a console script."""
    site = root / "lib" / "python3.11" / "site-packages"
    for name, version in dists.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (site / "pkg" / "__pycache__").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("X = 1\n")
    (site / "pkg" / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"\xa7\r\r\n")
    (site / "pkg" / "_speed.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    (site / "pkg" / "_abi.abi3.so").write_bytes(b"\x7fELF")
    (site / "pkg.libs").mkdir()
    (site / "pkg.libs" / "libz-0123.so.1").write_bytes(b"\x7fELF")
    (site / "pkg" / "_speed.cpython-311-x86_64-linux-gnu.so").chmod(0o700)  # pip keeps the wheel's modes
    (root / "bin").mkdir()
    (root / "bin" / "tool").write_text(f"#!{root}/bin/python\n")  # a host path: not for the image
    (root / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.7\n")
    return root


def test_the_tag_follows_every_installed_version(tmp_path: Path) -> None:
    venv = fake_venv(tmp_path / "venv", {"browser-use": "0.13.14", "pydantic": "2.13.5"})
    layer = VenvLayer(name="browser-use", venv=venv, python="3.11", imports=("pkg",), prefix=IMAGE_PREFIX)
    tag = venv_tag(layer)
    assert re.fullmatch(r"openforge-sandbox:browser-use-[0-9a-f]{12}", tag) and venv_tag(layer) == tag
    assert venv_recipe(layer)["packages"] == {"browser-use": "0.13.14", "pydantic": "2.13.5"}
    assert venv_recipe(layer)["base"]["variant"] == "browser"  # on the browser image, its recipe unchanged
    (venv / "lib" / "python3.11" / "site-packages" / "pkg" / "__init__.py").write_text("X = 2\n")
    assert venv_tag(layer) == tag  # the same install (versions) never rebuilds
    meta = next(venv.rglob("pydantic-*.dist-info")) / "METADATA"
    meta.write_text(meta.read_text().replace("2.13.5", "2.13.6"))
    assert venv_tag(layer) != tag
    assert compiled_modules(layer.site_packages) == ["pkg._abi", "pkg._speed"]  # not the vendored library


def test_the_venv_tarball_is_the_base_plus_a_venv_over_its_python(tmp_path: Path) -> None:
    base = build_rootfs_tar("busybox", tmp_path / "base.tar")
    venv = fake_venv(tmp_path / "venv", {"browser-use": "0.13.14"})
    layer = VenvLayer(name="browser-use", venv=venv, python="3.11", imports=("pkg",), prefix=IMAGE_PREFIX)
    out = build_venv_tar(layer, base, tmp_path / "bu.tar", ["pkg", "pkg._speed"])
    with tarfile.open(base) as tar:
        before = {m.name: (m.uid, m.mode, m.type) for m in tar}
    with tarfile.open(out) as tar:
        listed = tar.getnames()
        assert len(listed) == len(set(listed))  # docker import refuses a tar that names a path twice
        members = {m.name: m for m in tar}
        assert {k: (m.uid, m.mode, m.type) for k, m in members.items() if k in before} == before
        site = f"{IMAGE_PREFIX}/lib/python3.11/site-packages"
        added = sorted(name for name in members if name.startswith(IMAGE_PREFIX + "/"))
        assert added == sorted([f"{IMAGE_PREFIX}/{p}" for p in (
            "bin", "bin/python", "bin/python3", "lib", "lib/python3.11", "pyvenv.cfg", "forge-check.py",
            "forge-check.json")] + [site] + [f"{site}/{p}" for p in (
                "browser_use-0.13.14.dist-info", "browser_use-0.13.14.dist-info/METADATA", "pkg", "pkg/__init__.py",
                "pkg/__pycache__", "pkg/__pycache__/__init__.cpython-311.pyc", "pkg/_speed.cpython-311-x86_64-linux-gnu.so",
                "pkg/_abi.abi3.so", "pkg.libs", "pkg.libs/libz-0123.so.1")])  # no host bin/, no host pyvenv.cfg
        assert members[f"{IMAGE_PREFIX}/bin/python3"].linkname == "/usr/bin/python3"
        assert IMAGE_PYTHON == f"/{IMAGE_PREFIX}/bin/python3"
        cfg = tar.extractfile(members[f"{IMAGE_PREFIX}/pyvenv.cfg"]).read().decode()
        assert "home = /usr/bin\n" in cfg and "include-system-site-packages = false\n" in cfg
        spec = json.loads(tar.extractfile(members[f"{IMAGE_PREFIX}/forge-check.json"]).read())
        assert spec == {"python": "3.11", "modules": ["pkg", "pkg._speed"]}
        so = members[f"{site}/pkg/_speed.cpython-311-x86_64-linux-gnu.so"]
        assert (so.uid, so.gid, so.mode & 0o055) == (0, 0, 0o055)  # root's, loadable by the sandbox's user
        pyc = members[f"{site}/pkg/__pycache__/__init__.cpython-311.pyc"]
        assert pyc.mtime == int((venv / "lib/python3.11/site-packages/pkg/__pycache__/__init__.cpython-311.pyc").stat().st_mtime)
        for parent in ("opt", "opt/forge", IMAGE_PREFIX):
            assert members[parent].isdir() and members[parent].mode & 0o005 == 0o005, parent


def test_the_check_fails_a_module_that_does_not_load_and_reports_a_missing_stdlib_part(tmp_path: Path) -> None:
    """forge-check.py (run here by this python on a hand-made site-packages): a module whose shared library
    does not load fails the image; one needing a standard-library part the image's python lacks (Debian's
    tkinter) is reported, not failed; a module found outside the venv fails."""
    import subprocess
    import sys

    from openforge.sandbox.harness_image import VENV_CHECK

    site = tmp_path / "venv" / "lib" / "site-packages"
    site.mkdir(parents=True)
    (site / "good.py").write_text("X = 1\n")
    (site / "needs_tk.py").write_text("raise ModuleNotFoundError(\"No module named 'tkinter'\", name='tkinter')\n")
    (site / "broken.py").write_text("raise OSError('libfoo.so.1: cannot open shared object file')\n")

    def check(modules: list[str], python: str = f"{sys.version_info[0]}.{sys.version_info[1]}") -> tuple[int, list[str]]:
        spec = tmp_path / "spec.json"
        spec.write_text(json.dumps({"python": python, "modules": modules}))
        out = subprocess.run([sys.executable, "-c", VENV_CHECK, str(tmp_path / "venv"), str(spec)], capture_output=True,
                             text=True, timeout=60, env={"PYTHONPATH": str(site), "PATH": os.environ["PATH"]})
        return out.returncode, out.stderr.splitlines()

    code, lines = check(["good", "needs_tk"])
    assert code == 0 and lines[-1] == "1 of 2 modules load; ok" and any(l.startswith("SKIPPED") and "tkinter" in l for l in lines)
    code, lines = check(["good", "broken"])
    assert code == 1 and lines[-1] == "1 of 2 modules load; failed: broken: OSError: libfoo.so.1: cannot open shared object file"
    code, lines = check(["json"])  # this python's own, not the venv's
    assert code == 1 and "json: loaded from" in lines[-1] and "not from" in lines[-1]
    code, lines = check(["good"], python="3.99")
    assert code == 1 and lines[-1].startswith("the image's python3 is ") and lines[-1].endswith("made with 3.99")


def test_without_browser_use_installed_the_image_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(HarnessError, match="run `forge harness install browser-use`"):
        image_layer(tmp_path)


def test_forge_sandbox_build_image_refuses_browser_use_with_npm_harnesses() -> None:
    from typer.testing import CliRunner

    from openforge.forge_cli.main import app

    out = CliRunner().invoke(app, ["sandbox", "build-image", "--harness", "browser-use,codex"])
    assert out.exit_code == 1 and "build it alone (--harness browser-use)" in out.output, out.output
    assert "Traceback" not in out.output


# -- the real image, in real containers -------------------------------------------------------------

BUILD_SECONDS: dict[str, float] = {}


@pytest.fixture(scope="module")
def bu_image() -> str:
    """The browser-use image on the reachable engine, built (timed) from the cached browser tarball if the
    engine lacks it."""
    from openforge.sandbox.docker_engine import connect
    from openforge.sandbox.harness_image import ensure_venv_image
    from openforge.sandbox.container_images import has_image, image_tag, tarball_path

    if venv_python(CACHE) is None:
        skip_or_fail("browser-use", f"browser-use is not installed in {CACHE} (forge harness install browser-use --cache {CACHE})")
    try:
        client = connect(timeout=10)
    except SandboxError as exc:
        skip_or_fail("docker", f"{exc} (CI starts dockerd in .ci/run and exports DOCKER_HOST)")
    layer = image_layer(CACHE)
    browser, tag = image_tag("browser"), venv_tag(layer)
    try:
        present = has_image(client, tag)
        if not present and not tarball_path(browser).exists():  # the build reads it (no docker export)
            skip_or_fail("docker", f"no rootfs tarball of {browser} in the image cache to build {tag} on "
                        "(forge sandbox build-image --variant browser: ~10 minutes)")
    finally:
        client.close()
    start = time.monotonic()
    assert ensure_venv_image(layer, timeout=900) == tag
    BUILD_SECONDS["present" if present else "built"] = time.monotonic() - start
    print(f"\nbrowser-use image {tag}: {'present' if present else 'built/imported'} in {time.monotonic() - start:.1f} s")
    return tag


@pytest.mark.slow
async def test_browser_use_imports_in_a_container_as_the_sandbox_user(bu_image: str) -> None:
    """As uid 1000 with no capabilities, a read-only root and network `none`: the image's python3, as the
    venv, imports browser-use and every compiled module from the venv (not the image's own openai and
    pydantic, other versions), and the image's plain python3 keeps its own."""
    from openforge.sandbox.factory import make_sandbox

    probe = ("import os, sys, browser_use, pydantic, openai; from browser_use import Agent, BrowserSession; "
             "print(os.getuid(), sys.prefix, os.path.realpath(sys.executable), pydantic.VERSION, browser_use.__file__)")
    async with make_sandbox(DockerSandboxConfig(image=bu_image), run_id="run-bu", rollout_id="ro-bu-import") as sb:
        got = await sb.exec([IMAGE_PYTHON, "-c", probe], timeout=240)
        assert got.exit_code == 0, got
        uid, prefix, exe, pyd, where = got.stdout.split()
        assert (uid, prefix, exe) == (str(SANDBOX_UID), f"/{IMAGE_PREFIX}", "/usr/bin/python3.11"), got.stdout
        assert where.startswith(f"/{IMAGE_PREFIX}/lib/python3.11/site-packages/browser_use/")
        assert pyd == venv_distributions(image_layer(CACHE).site_packages)["pydantic"]  # the venv's exact version
        check = await sb.exec([IMAGE_PYTHON, f"/{IMAGE_PREFIX}/forge-check.py"], timeout=240)
        assert check.exit_code == 0 and check.stderr.splitlines()[-1].endswith("modules load; ok"), check
        net = await sb.exec("cat /proc/net/dev; grep CapEff /proc/self/status; touch /opt/forge/x 2>&1", timeout=60)
        assert [ln.split(":")[0].strip() for ln in net.stdout.splitlines() if ":" in ln and "Cap" not in ln
                and "touch" not in ln] == ["lo"], net.stdout
        assert "CapEff:\t0000000000000000" in net.stdout and "Read-only file system" in net.stdout, net.stdout


def browser_use_policy(engine: Any, input_ids: list[int], colour_index: int) -> str:
    """browser-use's JSON: click the button at `colour_index` among the four the page lists, then done."""
    state = engine.tokenizer.decode(input_ids).rsplit("<browser_state>", 1)[-1]
    buttons = re.findall(r"\[(\d+)\]<button", state)
    action = ({"click": {"index": int(buttons[colour_index])}} if len(buttons) == 4 else
              {"done": {"text": "clicked", "success": True, "files_to_display": []}})
    return json.dumps({"thinking": "", "evaluation_previous_goal": "", "memory": "", "next_goal": "",
                       "action": [action]})


@pytest.mark.slow
def test_browser_use_rollout_in_a_container(bu_image: str, tiny_vl_model: Path, store: Store, forge_home: Path) -> None:
    """One real browser-use rollout in a Docker container of the browser-use image through the real
    RolloutRunner on gui-colour-click-blue: its own chromium on the container's display at the task's page,
    its calls through the real proxy (the socket bound in) to a scripted engine on the tiny Qwen2-VL that
    clicks the blue button browser-use lists, then says done: scored 1 by the site's state on the host,
    each call with its screenshot. The same script clicking the red button scores 0."""
    from tests.helpers.gui_fixtures import run_gui_task
    from openforge.image_store import ImageStore
    from openforge.rollouts.tasks.format import load_tasks
    from openforge.rollouts.tasks.web.payload import WebPayload

    task = next(t for t in load_tasks("builtin-web") if t.id == "gui-colour-click-blue")
    order = task.payload(WebPayload).gui.params["order"]  # type: ignore[union-attr]
    harness = HarnessConfig(name="browser-use", max_turns=4, npm_cache=str(CACHE))
    got, seconds = {}, {}
    for colour in ("blue", "red"):
        start = time.monotonic()  # two chromium starts on 2 loaded cores: run_gui_task's time_limit_scale 5
        ro, _ = run_gui_task(store, tiny_vl_model,
                             lambda engine, ids, i=order.index(colour): browser_use_policy(engine, ids, i),
                             "gui-colour-click-blue", harness, sandbox=DockerSandboxConfig(image=bu_image))
        seconds[colour] = round(time.monotonic() - start, 1)
        assert (ro.status, ro.harness, ro.sandbox) == ("scored", "browser-use", "docker"), \
            (ro.error, ro.stdout[-3000:], ro.stderr[-3000:])
        calls = store.list_calls(rollout_id=ro.id)
        assert len(calls) == 2 and all(c.status == "ok" and len(c.images) == 1 for c in calls), calls
        shots = [ImageStore.for_run(forge_home, ro.run_id).describe(c.images[0]) for c in calls]
        assert all(s.format == "png" and s.size > 1000 and (s.width or 0) >= 640 for s in shots), shots  # stored
        got[colour] = ro.reward
    print(f"\nbrowser-use rollouts in docker: {seconds} s")
    assert got == {"blue": 1.0, "red": 0.0}


async def test_containers_and_pods_run_the_images_venv_and_name_the_build_when_it_is_missing(tmp_path: Path) -> None:
    """Docker containers and Kubernetes pods (the same image) run the image's venv python3, never the
    host's venv; an image without it fails `prepare` naming the build command (the runner's infra failure)."""
    from openforge.config import LocalSandboxConfig
    from openforge.rollouts.harnesses.base import HarnessContext
    from openforge.rollouts.harnesses import get_harness
    from openforge.sandbox.local import LocalSandbox

    harness = get_harness(HarnessConfig(name="browser-use", max_turns=3, npm_cache=str(tmp_path / "no-cache")))
    for backend in ("docker", "kubernetes"):
        ctx = HarnessContext(proxy_url="http://127.0.0.1:8700", api_key="k", model="m", instruction="i",
                             workdir="/workspace", backend=backend)
        assert harness.command(ctx)[:2] == [IMAGE_PYTHON, ".forge/browser_use_agent.py"]
        assert harness.env(ctx)["FORGE_CHROMIUM"] == "chromium"  # the image's
    # A sandbox without /opt/forge/browser-use (this machine, as a plain local sandbox) stands in for an
    # image without it: the check that prepare runs is the same exec on any backend.
    async with LocalSandbox(LocalSandboxConfig(isolation="none"), run_id="run-bu", rollout_id="ro-bu-missing") as sb:
        ctx = HarnessContext(proxy_url=sb.proxy_url, api_key="k", model="m", instruction="i",
                             workdir=sb.info.workdir, backend="kubernetes")
        with pytest.raises(HarnessError) as err:
            await harness.prepare(sb, ctx)
    message = str(err.value)
    assert message.startswith("browser-use is not installed in the kubernetes sandbox image (/opt/forge/browser-use")
    assert message.endswith("build one with `forge sandbox build-image --harness browser-use` and set sandbox.image "
                            "to its tag") and "\n" not in message


def test_forge_sandbox_build_image_harness_browser_use(bu_image: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command gives the same tag (the engine has it: no rebuild) and how to use it."""
    from typer.testing import CliRunner

    from openforge.forge_cli.main import app

    monkeypatch.setenv("FORGE_NPM_CACHE", str(CACHE))
    out = CliRunner().invoke(app, ["sandbox", "build-image", "--harness", "browser-use", "--no-latest"])
    assert out.exit_code == 0 and out.output.splitlines() == [
        bu_image, f"use it with: --set sandbox.type=docker --set sandbox.image={bu_image}"], out.output
