"""The connection to a Docker engine, shared by the Docker backend (sandbox/docker.py), image builds
(sandbox/container_images.py) and the sandbox sweeper (sandbox/gc.py)."""

from __future__ import annotations

import os
from typing import Any

from openforge.errors import SandboxError


def connect(base_url: str = "", timeout: float = 30) -> Any:
    """A docker SDK client that has answered a ping, or a SandboxError saying where it looked."""
    try:
        import docker
    except ImportError:
        raise SandboxError("the docker SDK is not installed (pip install docker); use sandbox.type = \"local\"") from None
    url = base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        client = docker.DockerClient(base_url=url, timeout=timeout)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure here means "no engine", said plainly
        why = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise SandboxError(f"no Docker engine reachable at {url} ({why}); use sandbox.type = \"local\" or "
                           "start Docker") from None
    return client
