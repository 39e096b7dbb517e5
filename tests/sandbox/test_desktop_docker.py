"""Desktop tasks in Docker containers: the `desktop` image variant (sandbox/container_images.py: the python image +
Xvfb, xdotool, fonts, Pillow and the Debian packages of the task's applications, no browser) runs the
xedit task of tests/rollouts/tasks/desktop/test_desktop_tasks.py through the real runner as the sandbox's user (uid 1000), and
an image without a display stops the rollout before the agent with the build command to use.

The runner test uses the desktop image with x11-apps when the engine has it or its rootfs tarball is
cached (`forge sandbox build-image --variant desktop --packages x11-apps`, ~4 minutes the first time;
.ci/run builds it, and FORGE_REQUIRE=docker makes its absence a failure); bench/desktop_real.py runs
LibreOffice Calc the same way."""

from __future__ import annotations

from pathlib import Path

import pytest

from openforge.config import ForgeConfig
from openforge.errors import SandboxError
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.selfcheck import _StandInHarness
from openforge.sandbox.container_images import DESKTOP_PACKAGES, has_image, image_tag, recipe, tarball_path
from openforge.store import Store
from tests.helpers.required import skip_or_fail
from tests.helpers.desktop import EDITOR_TASK, GUI, SAVE, SAVED, TEXT, WORDS, _import

EDITOR = ("x11-apps",)


def test_the_desktop_recipe_adds_a_display_and_the_named_packages_only() -> None:
    apt = recipe("desktop", ("vlc", "libreoffice-calc", "vlc"))["apt"]
    assert set(DESKTOP_PACKAGES) <= set(apt) and "chromium" not in apt
    assert apt[-2:] == ("libreoffice-calc", "vlc")  # sorted, once each: one tag per set of packages
    assert image_tag("desktop", ("vlc", "libreoffice-calc")) == image_tag("desktop", ("libreoffice-calc", "vlc"))
    assert image_tag("desktop", ("vlc",)) != image_tag("desktop", ("libreoffice-calc",)) != image_tag("desktop")
    with pytest.raises(SandboxError, match="not a Debian package name: 'vlc; rm -rf /'"):
        recipe("desktop", ("vlc; rm -rf /",))
    with pytest.raises(SandboxError, match="desktop variant only"):
        recipe("python", ("vlc",))


def _engine():  # type: ignore[no-untyped-def]
    from openforge.sandbox.docker_engine import connect

    try:
        return connect(timeout=10)
    except SandboxError as exc:
        skip_or_fail("docker", f"{exc} (CI starts dockerd in .ci/run and exports DOCKER_HOST)")


async def _run(store: Store, tmp_path: Path, image: str, scripts: dict[str, str]) -> dict[str, tuple]:
    task = _import(tmp_path, EDITOR_TASK)[0]
    run = store.create_run(kind="check", name="desktop-docker")
    config = ForgeConfig.model_validate({"sandbox": {"type": "docker", "image": image}})
    got = {}
    for label, script in scripts.items():
        runner = RolloutRunner(store, config=config, proxy_url="http://127.0.0.1:9",
                               harness=_StandInHarness({task.id: script}, {}))
        (ro,) = await runner.run(run.id, [RolloutSpec(task)])
        got[label] = (ro.status, ro.reward, ro.failure_kind, f"{ro.error}\n{ro.verifier_output}\n{ro.stderr}")
    return got


async def test_an_image_without_a_display_stops_the_rollout_with_the_desktop_build(store: Store,
                                                                                   tmp_path: Path) -> None:
    """The python image has no Xvfb: the rollout fails as infrastructure before the agent, never scored.
    (The desktop image has no chromium: the editor test below fails if a desktop's display asks for one.)"""
    client = _engine()
    python = image_tag("python")
    if not has_image(client, python):
        skip_or_fail("docker", f"{python} is not built (forge sandbox build-image)")
    client.close()
    got = await _run(store, tmp_path, python, {"would pass": f"printf '{WORDS}' > note.txt"})
    status, reward, kind, said = got["would pass"]
    assert (status, reward, kind) == ("failed", None, "infra"), said
    assert "desktop task xedit-note cannot start: not installed in the sandbox: Xvfb" in said, said


async def test_the_editor_on_a_containers_display_is_how_the_task_is_done(store: Store, tmp_path: Path) -> None:
    client = _engine()
    image = image_tag("desktop", EDITOR)
    if not has_image(client, image) and not tarball_path(image).exists():
        client.close()
        skip_or_fail("docker", f"{image} is not built (forge sandbox build-image --variant desktop --packages "
                     "x11-apps: .ci/run builds it)")
    from openforge.sandbox.container_images import ensure_image

    ensure_image("desktop", packages=EDITOR, timeout=600)  # imports the cached tarball on a fresh engine
    client.close()
    got = await _run(store, tmp_path, image, {
        "typed": f"{GUI} click {TEXT} && {GUI} type '{WORDS}' && {GUI} click {SAVE} && {SAVED}",
        "unsaved": f"{GUI} click {TEXT} && {GUI} type '{WORDS}' && sleep 1",
        "whoami": f"test \"$(id -u)\" = 1000 && {GUI} click {TEXT} && {GUI} type '{WORDS}' && {GUI} click {SAVE} "
                  f"&& {SAVED}"})
    assert {k: v[:2] for k, v in got.items()} == {
        "typed": ("scored", 1.0), "unsaved": ("scored", 0.0), "whoami": ("scored", 1.0)}, got
    assert "exact_match: 1" in got["typed"][3]
