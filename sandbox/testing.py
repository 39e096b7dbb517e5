"""Helpers for tests that run on every available backend (ours, and the rollout tests' "same rollout on
each backend"). Nothing here fakes a backend: a backend that cannot run here is skipped with the reason.

    @pytest.fixture(params=sandbox_backends())
    def sandbox_config(request):
        config, reason = backend_config(request.param)
        if config is None:
            pytest.skip(reason)
        return config
"""

from __future__ import annotations

import functools
import os

from openforge.config import DockerSandboxConfig, LocalSandboxConfig, SandboxConfig
from openforge.environment import forge_env
from openforge.errors import SandboxError


def sandbox_backends() -> list[str]:
    """The parametrisation: local with bubblewrap, local as plain subprocesses, docker."""
    return ["local-bwrap", "local-plain", "docker"]


@functools.lru_cache(maxsize=4)
def docker_image(variant: str) -> tuple[str | None, str]:
    """(tag, "") of the variant's image on the reachable engine, built if needed; else (None, why).

    The python variant is only *used* if it already exists (or FORGE_BUILD_PYTHON_IMAGE=1): its
    first build takes a minute or more, which belongs to CI's setup, not to a test."""
    import os

    from openforge.sandbox.docker_engine import connect
    from openforge.sandbox.container_images import ensure_image, image_tag

    try:
        client = connect(timeout=10)
    except SandboxError as exc:
        return None, f"{exc} (CI starts dockerd in .ci/run and exports DOCKER_HOST)"
    try:
        if variant == "python" and not forge_env("FORGE_BUILD_PYTHON_IMAGE"):
            try:
                client.images.get(image_tag("python"))
            except Exception:  # noqa: BLE001 - ImageNotFound, said as a skip reason
                return None, f"{image_tag('python')} is not built (forge sandbox build-image)"
        return ensure_image(variant, timeout=900), ""
    except SandboxError as exc:
        return None, f"cannot build the {variant} image: {exc}"
    finally:
        client.close()




def proxy_socket_path() -> str:
    """A fresh path for a proxy's unix socket, short enough for sun_path (108 bytes), unlike pytest's tmp_path."""
    import tempfile

    return os.path.join(tempfile.mkdtemp(prefix="forge-t-"), "proxy.sock")


def backend_config(name: str, *, image: str = "busybox", **local: object) -> tuple[SandboxConfig | None, str]:
    """A SandboxConfig for one parametrised backend, or (None, reason) when it cannot run here."""
    from openforge.sandbox.local import bwrap_usable

    config: SandboxConfig
    if name == "local-bwrap":
        if not bwrap_usable():
            return None, "bubblewrap missing or unable to create namespaces (apt-get install bubblewrap)"
        config = LocalSandboxConfig(isolation="bwrap", **local)  # type: ignore[arg-type]
    elif name == "local-plain":
        config = LocalSandboxConfig(isolation="none", **local)  # type: ignore[arg-type]
    elif name == "docker":
        tag, why = docker_image(image)
        if tag is None:
            return None, why
        config = DockerSandboxConfig(image=tag)
    else:
        raise ValueError(name)
    return config, ""
