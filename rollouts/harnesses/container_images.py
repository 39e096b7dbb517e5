"""A sandbox image with harnesses in it (`forge sandbox build-image --harness NAMES`), as each harness
declares itself (`npm_harness()`, `venv_layer()` on its adapter):

    npm programs (claude-code, codex, opencode, openclaw, a spec's [install] npm)
        one image: the python image + their packages, each program on the PATH (several in one image)
    a Python program in a venv (mini-swe-agent, a spec's [install] pip; browser-use on the browser image)
        an image of its own: its base image + the venv at /opt/forge/<name>, its program on the PATH

Each harness is installed into the cache first when it is missing; the image copies what the cache holds,
so a container runs exactly the versions a local sandbox runs.
"""

from __future__ import annotations

from pathlib import Path

from openforge.errors import HarnessError
from openforge.rollouts.harnesses import harness_class, npm_harness
from openforge.rollouts.harnesses.npm import image_layer


def build_harness_image(names: list[str], cache: Path, *, base_url: str = "", tag_latest: bool = False) -> str:
    """The tag of the image with harnesses `names`, built (or found built) on the Docker engine."""
    from openforge.sandbox.harness_image import ensure_harness_image, ensure_venv_image

    if not names:
        raise HarnessError("name at least one harness (--harness claude-code,codex)")
    classes = {name: harness_class(name) for name in names}
    others = [name for name, cls in classes.items() if cls.npm_harness() is None]
    if others and len(names) > 1:
        raise HarnessError(f"{others[0]} is not an npm program, and a Python harness gets an image of its own: "
                           f"build it alone (--harness {others[0]}), the npm harnesses together")
    if others:
        cls = classes[others[0]]
        try:
            layer = cls.venv_layer(cache)
        except HarnessError:  # a venv harness that is not installed yet
            cls.install(cache)
            layer = cls.venv_layer(cache)
        if layer is None:
            raise HarnessError(f"harness {others[0]!r} needs no image of its own: it runs on the python image "
                               "(forge sandbox build-image)")
        return ensure_venv_image(layer, base_url=base_url, tag_latest=tag_latest)
    for cls in classes.values():
        cls.install(cache)  # a no-op when the cache has it
    return ensure_harness_image(image_layer({name: npm_harness(name) for name in names}, cache), base_url=base_url, tag_latest=tag_latest)
