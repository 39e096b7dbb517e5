"""Harnesses inside containers (issue 15): the harness image (`forge sandbox build-image --harness ...`)
and real Claude Code / Codex rollouts in Docker containers, as the sandbox's non-root user, reaching the
recording proxy only through its unix socket, scored by the task's exact check.

The image is built by .ci/run (from the npm cache it installs); a test that needs it skips with the
reason when it is absent (FORGE_BUILD_HARNESS_IMAGE=1 builds it here, ~1-2 min the first time).
"""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest

from openforge.errors import HarnessError, SandboxError
from openforge.rollouts.harnesses import npm_harness
from openforge.rollouts.harnesses.npm import image_layer
from openforge.sandbox.harness_image import NPM_PREFIX, NpmLayer, build_harness_tar, harness_tag, npm_closure
from openforge.sandbox.container_images import SANDBOX_UID, build_rootfs_tar
from openforge.sandbox.testing import proxy_socket_path
from tests.helpers.containers import harness_config, harness_image, run_in_container
from tests.helpers.required import skip_or_fail
from tests.helpers.proxy_rig import make_rig  # noqa: F401 - fixture
from tests.helpers.harnesses import ANSWER, COMMAND, NPM_CACHE, check_extends, check_recording, tool_then_answer

pytestmark = pytest.mark.timeout(180)


# -- the recipe and the tarball, on a hand-made npm install ---------------------------------------

def package(root: Path, rel: str, version: str, deps: dict[str, str] | None = None,
            optional: dict[str, str] | None = None, files: dict[str, bytes] | None = None) -> Path:
    folder = root / rel
    folder.mkdir(parents=True)
    meta = {"name": rel.rsplit("node_modules/", 1)[-1], "version": version, "dependencies": deps or {},
            "optionalDependencies": optional or {}}
    (folder / "package.json").write_text(json.dumps(meta))
    for name, data in (files or {}).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


@pytest.fixture
def install(tmp_path: Path) -> Path:
    """An npm prefix as npm lays it out: a nested copy of `d` where `b` needs another version, a scoped
    package, an optional dependency for another platform that npm did not install, and an unrelated one."""
    prefix = tmp_path / "npm"
    package(prefix, "node_modules/a", "1.0.0", deps={"b": "^2"}, optional={"a-linux": "1", "a-darwin": "1"},
            files={"bin/a": b"#!/bin/sh\necho a\n"})
    package(prefix, "node_modules/a-linux", "1.0.0", files={"a.exe": b"\x7fELF..."})
    package(prefix, "node_modules/b", "2.1.0", deps={"d": "^2", "@s/e": "*"})
    package(prefix, "node_modules/b/node_modules/d", "2.0.0")
    package(prefix, "node_modules/d", "1.0.0")  # what the top level has; b needs its own 2.0.0
    package(prefix, "node_modules/@s/e", "0.3.0", deps={"d": "^1"})
    package(prefix, "node_modules/unrelated", "9.9.9")
    (prefix / "node_modules" / "a" / "bin" / "a").chmod(0o700)  # npm leaves some modes private
    return prefix


def test_the_closure_follows_nodes_resolution(install: Path):
    assert npm_closure(install, ["a"]) == {
        "node_modules/a": "1.0.0", "node_modules/a-linux": "1.0.0", "node_modules/b": "2.1.0",
        "node_modules/b/node_modules/d": "2.0.0", "node_modules/@s/e": "0.3.0", "node_modules/d": "1.0.0"}
    with pytest.raises(SandboxError, match="nope is not installed in"):
        npm_closure(install, ["nope"])


def test_the_tag_follows_every_copied_version(install: Path):
    layer = NpmLayer(names=("a",), prefix=install, packages=("a",), bins={"a": "node_modules/a/bin/a"})
    tag = harness_tag(layer)
    assert tag.startswith("openforge-sandbox:a-") and harness_tag(layer) == tag
    unrelated = install / "node_modules" / "unrelated" / "package.json"
    unrelated.write_text(unrelated.read_text().replace("9.9.9", "10.0.0"))
    assert harness_tag(layer) == tag  # not in the image: not in the recipe
    nested = install / "node_modules" / "b" / "node_modules" / "d" / "package.json"
    nested.write_text(nested.read_text().replace("2.0.0", "2.0.1"))
    assert harness_tag(layer) != tag


def test_the_harness_tarball_is_the_base_plus_the_packages(install: Path, tmp_path: Path):
    base = build_rootfs_tar("busybox", tmp_path / "base.tar")
    layer = NpmLayer(names=("a",), prefix=install, packages=("a",), bins={"a": "node_modules/a/bin/a"},
                     node=install / "node_modules" / "a-linux" / "a.exe")
    out = build_harness_tar(layer, base, tmp_path / "harness.tar")
    with tarfile.open(base) as tar:
        before = {m.name: (m.uid, m.mode, m.type) for m in tar}
    with tarfile.open(out) as tar:
        listed = tar.getnames()
        assert len(listed) == len(set(listed))  # docker import refuses a tar that names a path twice
        members = {m.name: m for m in tar}
        after = {m.name: (m.uid, m.mode, m.type) for m in members.values()}
        assert {k: after[k] for k in before} == before  # the base as it was, the user's folders included
        assert (before["workspace"][0], before["home/forge"][0]) == (SANDBOX_UID, SANDBOX_UID)
        npm = f"{NPM_PREFIX}/node_modules"
        copied = sorted(name for name in members if name.endswith("/package.json"))
        assert copied == sorted(f"{npm}/{p}/package.json" for p in
                                ("a", "a-linux", "b", "b/node_modules/d", "@s/e", "d"))
        exe = members[f"{npm}/a/bin/a"]
        assert (exe.uid, exe.mode & 0o055) == (0, 0o055)  # root's, runnable by the sandbox's user
        link = members["usr/local/bin/a"]
        assert link.issym() and link.linkname == f"/{npm}/a/bin/a"
        assert members["usr/local/bin/node"].linkname == f"/{npm}/a-linux/a.exe"
        for parent in ("opt", "opt/forge", NPM_PREFIX, npm, f"{npm}/@s", "usr/local", "usr/local/bin"):
            assert members[parent].isdir(), parent
        assert tar.extractfile(members[f"{npm}/a-linux/a.exe"]).read() == b"\x7fELF..."


def test_a_harness_missing_from_the_cache_names_the_fix(tmp_path: Path):
    with pytest.raises(HarnessError, match="forge harness install codex"):
        image_layer({"codex": npm_harness("codex")}, tmp_path)
    with pytest.raises(HarnessError, match="'mini' is not an npm harness"):
        npm_harness("mini")


# -- real harnesses in real containers --------------------------------------------------------------


@pytest.mark.slow
async def test_claude_code_rollout_in_a_container(make_rig):
    rig = make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=400_000)
    rig.engine.script = tool_then_answer(rig.engine.tokenizer, "Bash", {"command": COMMAND, "description": "write"})
    ro, rig = await run_in_container(rig, "claude-code", extra_args=["--bare", "--tools", "Bash"])
    assert (ro.status, ro.reward, ro.exit_code, ro.harness) == ("scored", 1.0, 0, "claude-code"), \
        (ro.error, ro.stderr[-2000:], ro.stdout[-2000:])
    assert json.loads(ro.stdout)["result"] == ANSWER
    check_extends(rig, check_recording(rig, "anthropic_messages"))


@pytest.mark.slow
async def test_codex_rollout_in_a_container(make_rig):
    rig = make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=400_000)
    rig.engine.script = tool_then_answer(rig.engine.tokenizer, "exec_command", {"cmd": COMMAND})
    ro, rig = await run_in_container(rig, "codex")
    assert (ro.status, ro.reward, ro.exit_code, ro.harness) == ("scored", 1.0, 0, "codex"), \
        (ro.error, ro.stderr[-3000:])
    check_extends(rig, check_recording(rig, "openai_responses"))


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.skipif(os.environ.get("FORGE_TEST_OPENCLAW") != "1", reason="OpenClaw takes 20-90 s to start here: "
                    "opt in with FORGE_TEST_OPENCLAW=1 (its image: forge sandbox build-image --harness openclaw)")
async def test_openclaw_rollout_in_a_container(make_rig):
    tag, why = harness_image(("openclaw",))
    if tag is None:
        pytest.skip(why)
    rig = make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=400_000)
    rig.engine.script = tool_then_answer(rig.engine.tokenizer, "exec", {"command": COMMAND})
    ro, rig = await run_in_container(rig, "openclaw", image=tag, timeout_s=300)
    assert (ro.status, ro.reward, ro.exit_code, ro.harness) == ("scored", 1.0, 0, "openclaw"), \
        (ro.error, ro.stderr[-3000:], ro.stdout[-2000:])
    assert check_recording(rig, "openai_chat")["n_segments"] == 2  # OpenClaw rewrites its history


async def test_the_harness_container_runs_as_the_sandbox_user():
    """The image's executables run as uid 1000 on a read-only root, with no capabilities."""
    from openforge.sandbox.factory import make_sandbox

    async with make_sandbox(harness_config("codex"), run_id="run-h", rollout_id="ro-harness-user") as sb:
        got = await sb.exec('id -u; touch /x 2>&1; grep -E "^(CapEff|NoNewPrivs)" /proc/self/status; '
                            'claude --version; codex --version; node --version', timeout=60)
        lines = got.stdout.splitlines()
        assert lines[0] == str(SANDBOX_UID) and "Read-only file system" in got.stdout, got
        assert "CapEff:\t0000000000000000" in lines and "NoNewPrivs:\t1" in lines, got
        assert got.exit_code == 0 and "Claude Code" in got.stdout and "codex-cli" in got.stdout, got
        assert sb.info.home == "/home/forge"
        await sb.write_file(".forge/deep/x.txt", b"x")  # new folders are the user's: it can write there
        got = await sb.exec("echo y > .forge/deep/y.txt && cat .forge/deep/x.txt", timeout=30)
        assert (got.exit_code, got.stdout) == (0, "x"), got
        with pytest.raises(SandboxError, match="root is read-only"):
            await sb.write_file("/etc/forge.txt", b"no")


def test_the_cache_layer_is_what_the_local_backend_runs():
    """The image copies exactly the executables the local backend runs from the same cache."""
    from openforge.rollouts.harnesses.npm import find_package_bin

    if find_package_bin(NPM_CACHE, "codex", npm_harness("codex")) is None or \
            find_package_bin(NPM_CACHE, "claude-code", npm_harness("claude-code")) is None:
        skip_or_fail("npm", f"claude-code and codex are not both installed in {NPM_CACHE}")
    layer = image_layer({n: npm_harness(n) for n in ("claude-code", "codex")}, NPM_CACHE)
    assert {name: NPM_CACHE / rel for name, rel in layer.bins.items()} == {
        "claude": find_package_bin(NPM_CACHE, "claude-code", npm_harness("claude-code")),
        "codex": find_package_bin(NPM_CACHE, "codex", npm_harness("codex"))}
    assert set(layer.packages) == {"@anthropic-ai/claude-code", "@openai/codex"}


def test_a_kubernetes_pod_runs_the_same_image_as_its_user():
    """The pod spec takes the harness image as it is: the pod's uid and $HOME are the image's user."""
    from openforge.config import KubernetesSandboxConfig
    from openforge.sandbox.container_images import SANDBOX_HOME
    from openforge.sandbox.k8s_manifests import build_pod_manifest, check_pod_manifest

    image = "registry.example.com/openforge-sandbox:claude-code-codex-0123456789ab"
    config = KubernetesSandboxConfig(image=image)
    pod = build_pod_manifest(config, name="forge-ro-1-abcdef", run_id="run-1", rollout_id="ro-1")
    check_pod_manifest(pod)
    [container] = pod["spec"]["containers"]
    assert container["image"] == image
    assert pod["spec"]["securityContext"]["runAsUser"] == SANDBOX_UID == config.run_as_user
    assert {"name": "HOME", "value": SANDBOX_HOME} in container["env"]
    # and the grader's folder, outside the agent's tree (issue 43)
    assert {m["mountPath"] for m in container["volumeMounts"]} == {config.workdir, SANDBOX_HOME, "/tmp", "/forge-grader"}


def test_forge_sandbox_build_image_harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The command: the built image's tag (no rebuild when the engine has it), one-line errors otherwise."""
    from typer.testing import CliRunner

    from openforge.forge_cli.main import app

    out = CliRunner().invoke(app, ["sandbox", "build-image", "--harness", "mini"])
    assert out.exit_code == 1 and "'mini' needs no image of its own" in out.output and "Traceback" not in out.output
    out = CliRunner().invoke(app, ["sandbox", "build-image", "--harness", "codex,mini-swe-agent"])
    assert out.exit_code == 1 and "build it alone (--harness mini-swe-agent)" in out.output, out.output
    out = CliRunner().invoke(app, ["sandbox", "build-image", "--harness", "nope"])
    assert out.exit_code == 1 and "unknown harness 'nope'" in out.output and "Traceback" not in out.output
    tag, why = harness_image(("claude-code", "codex"))
    if tag is not None:
        monkeypatch.setenv("FORGE_NPM_CACHE", str(NPM_CACHE))
        out = CliRunner().invoke(app, ["sandbox", "build-image", "--harness", "claude-code,codex", "--no-latest"])
        assert out.exit_code == 0 and out.output.splitlines() == [
            tag, f"use it with: --set sandbox.type=docker --set sandbox.image={tag}"], out.output
    monkeypatch.setenv("FORGE_NPM_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no npm to install it with
    out = CliRunner().invoke(app, ["sandbox", "build-image", "--harness", "codex"])
    assert out.exit_code == 1 and "npm is not installed" in out.output and "Traceback" not in out.output
