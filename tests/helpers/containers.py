"""The container tests' images: a command run in the harness image and the browser image, built when missing."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from openforge.config import DockerSandboxConfig, ForgeConfig, HarnessConfig
from openforge.environment import forge_env
from openforge.errors import HarnessError, SandboxError
from openforge.rollouts.harnesses import npm_harness
from openforge.rollouts.harnesses.npm import image_layer
from openforge.sandbox.harness_image import harness_tag
from openforge.sandbox.container_images import SANDBOX_UID
from tests.helpers.required import skip_or_fail
from tests.helpers.harnesses import NPM_CACHE
from openforge.errors import SandboxError


@functools.lru_cache(maxsize=4)
def harness_image(names: tuple[str, ...]) -> tuple[str | None, str]:
    """(tag, "") of the harness image of `names` built from the test npm cache, on the reachable engine;
    else (None, why). Used only if it exists (.ci/run builds it), or FORGE_BUILD_HARNESS_IMAGE=1."""
    from openforge.sandbox.docker_engine import connect
    from openforge.sandbox.harness_image import ensure_harness_image, harness_tag
    from openforge.sandbox.container_images import has_image

    try:
        layer = image_layer({name: npm_harness(name) for name in names}, NPM_CACHE)
    except HarnessError as exc:
        return None, f"no harness image without the harnesses: {exc}"
    try:
        client = connect(timeout=10)
    except SandboxError as exc:
        return None, f"{exc} (CI starts dockerd in .ci/run and exports DOCKER_HOST)"
    try:
        tag = harness_tag(layer)
        if not has_image(client, tag) and not forge_env("FORGE_BUILD_HARNESS_IMAGE"):
            return None, (f"{tag} is not built (forge sandbox build-image --harness {','.join(names)}, "
                          "or FORGE_BUILD_HARNESS_IMAGE=1)")
        return ensure_harness_image(layer, timeout=900), ""
    except SandboxError as exc:
        return None, f"cannot build the harness image: {exc}"
    finally:
        client.close()


def harness_config(name: str) -> DockerSandboxConfig:
    tag, why = harness_image(("claude-code", "codex"))
    if tag is None:
        skip_or_fail("docker", why)
    return DockerSandboxConfig(image=tag)


async def run_in_container(rig: Any, name: str, image: str = "", timeout_s: float = 120,
                           **harness: Any):  # noqa: ANN201
    """One rollout of harness `name` through the RolloutRunner in a container of the harness image; the
    task is checked exactly (proof.txt must be `forge-ok\\n`)."""
    from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
    from openforge.rollouts.tasks.format import TaskSpec

    config = ForgeConfig(sandbox=DockerSandboxConfig(image=image) if image else harness_config(name))
    config.harness = HarnessConfig(name=name, max_turns=4, **harness)
    task = TaskSpec(id="proof", instruction="Write forge-ok into proof.txt, then say you are done.",
                    time_limit_s=timeout_s,
                    expect_files={"proof.txt": "forge-ok\n"},
                    verifier=f'[ "$(id -u)" = {SANDBOX_UID} ] && ! touch /forge-root-write 2>/dev/null')
    runner = RolloutRunner(rig.store, config=config, proxy_url=rig.url, proxy_socket=rig.proxy.uds)
    [ro] = await runner.run(rig.rollout.run_id, [RolloutSpec(task, 0)])
    return ro, dataclasses.replace(rig, rollout=rig.store.get_rollout(ro.id))  # the rig, on the runner's rollout


def browser_image() -> str:
    """The browser image's tag on the reachable engine (imported from its cached tarball if need be)."""
    from openforge.sandbox.docker_engine import connect
    from openforge.sandbox.container_images import ensure_image, has_image, image_tag, tarball_path

    try:
        client = connect(timeout=10)
    except SandboxError as exc:
        skip_or_fail("docker", f"{exc} (CI starts dockerd in .ci/run and exports DOCKER_HOST)")
    tag = image_tag("browser")
    try:
        if not has_image(client, tag) and not tarball_path(tag).exists():
            skip_or_fail("docker", f"{tag} is not built (forge sandbox build-image --variant browser)")
    finally:
        client.close()
    return ensure_image("browser", timeout=600)
