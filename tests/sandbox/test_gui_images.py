"""The `browser` Docker image (`forge sandbox build-image --variant browser`): in a container with network
`none`, as the sandbox's user, sandbox/gui.py starts Xvfb and chromium on a page and takes the
screenshot (Debian's Pillow, over XCB), and a headless chromium screenshots too.

The image is used when the engine has it or its rootfs tarball is cached (an import takes seconds);
building it (debootstrap + apt, ~10 minutes) only with FORGE_BUILD_BROWSER_IMAGE=1."""

from __future__ import annotations

import pytest

from openforge.environment import forge_env
from openforge.errors import SandboxError
from openforge.sandbox.container_images import SANDBOX_UID, ensure_image, has_image, image_tag, recipe, tarball_path
from tests.helpers.paths import REPO
from tests.helpers.required import skip_or_fail

pytestmark = pytest.mark.slow

RED_PAGE = "data:text/html,<body style='margin:0;background:rgb(255,0,0)'></body>"


def browser_image():  # type: ignore[no-untyped-def]
    from openforge.sandbox.docker_engine import connect

    try:
        client = connect(timeout=10)
    except SandboxError as exc:
        skip_or_fail("docker", f"{exc} (CI starts dockerd in .ci/run and exports DOCKER_HOST)")
    tag = image_tag("browser")
    if not has_image(client, tag) and not tarball_path(tag).exists() and \
            not forge_env("FORGE_BUILD_BROWSER_IMAGE"):
        skip_or_fail("docker", f"{tag} is not built (forge sandbox build-image --variant browser, "
                    "or FORGE_BUILD_BROWSER_IMAGE=1)")
    return client, ensure_image("browser", timeout=1500)


def test_the_browser_recipe_adds_the_gui_packages() -> None:
    apt = recipe("browser")["apt"]
    assert {"chromium", "xvfb", "xdotool", "fonts-dejavu-core", "python3-pil"} <= set(apt)
    assert image_tag("browser") != image_tag("python")


def test_chromium_screenshots_in_a_container_without_network() -> None:
    from pathlib import Path

    client, tag = browser_image()
    gui = REPO / "sandbox" / "gui.py"
    script = (f"python3 /opt/gui.py run --size 320x240 --kiosk \"{RED_PAGE}\" -- python3 -c \"import sys; "
              "sys.path.insert(0, '/opt'); import gui; im = gui.screenshot(); print('shot', im.size, "
              "im.getpixel((160, 120)))\" && cd /tmp && chromium --headless --no-sandbox --disable-gpu "
              f"--user-data-dir=/tmp/p --screenshot=/tmp/s.png --window-size=320,240 \"{RED_PAGE}\" 2>/dev/null; "
              "python3 -c \"from PIL import Image; im = Image.open('/tmp/s.png'); print('headless', im.size, "
              "im.getpixel((5, 5)))\"; grep -c : /proc/net/dev; id -u")
    out = client.containers.run(tag, ["sh", "-c", script], remove=True, user=f"{SANDBOX_UID}:{SANDBOX_UID}",
                                network_mode="none", volumes={str(gui): {"bind": "/opt/gui.py", "mode": "ro"}},
                                stdout=True, stderr=True).decode()
    assert "shot (320, 240) (255, 0, 0)" in out, out
    assert "headless (320, 240) (255, 0, 0)" in out, out
    lines = out.strip().splitlines()
    assert lines[-2] == "1" and lines[-1] == str(SANDBOX_UID), out  # only `lo`; the sandbox's user
