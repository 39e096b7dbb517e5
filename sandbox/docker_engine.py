"""The connection to a Docker engine, shared by the Docker backend (sandbox/docker.py), image builds
(sandbox/container_images.py) and the sandbox sweeper (sandbox/gc.py), and `probe`, what `forge doctor`
and the backend's preflight say of it."""

from __future__ import annotations

import os
from typing import Any

from openforge.config import DockerSandboxConfig
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


def engine_url(base_url: str = "") -> str:
    """Where the docker SDK looks: `sandbox.base_url`, else DOCKER_HOST, else the default socket."""
    return base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def probe(config: DockerSandboxConfig) -> tuple[str, str]:
    """(verdict, detail) of the engine `config` names: ok (it answers, the image is on it), warn (it answers,
    the image is not) or missing (no SDK, or no engine answers)."""
    url = engine_url(config.base_url)
    try:
        import docker
    except ImportError:
        return "missing", "the docker SDK is not installed (pip install docker)"
    try:
        client = docker.DockerClient(base_url=url, timeout=5)
        version = client.version().get("Version", "?")
    except Exception as exc:  # noqa: BLE001 - any failure means "not reachable", said plainly
        why = str(exc).splitlines()[0][:160]
        return "missing", f"no engine reachable at {url} ({why}); sandbox = \"local\" works"
    image = config.image
    try:
        client.images.get(image)
    except Exception:  # noqa: BLE001 - ImageNotFound (or an engine that stopped answering)
        return "warn", f"{version} at {url}; image {image} missing: forge sandbox build-image"
    finally:
        client.close()
    return "ok", f"{version} at {url}; image {image} present"
