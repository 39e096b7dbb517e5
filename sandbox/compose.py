"""Compose services beside a rollout's container, on the Docker backend.

A Harbor task's environment/docker-compose.yaml may declare services beside `main` (a database, an API
the tests query). Harbor runs them with `docker compose up` on one network, where the agent reaches each
by its service name. forge does the same with the docker SDK, per rollout (no compose binary):

    network   openforge-svc-<rollout id>: a bridge of its own; without sandbox.allow_internet it is
              `internal` (no route out) and its bridge has no address on the host
              (`inhibit_ipv4`), so nothing on it reaches the host either
    services  one container each, from its image (the engine must hold it: forge pulls nothing), with
              its `environment` and `command`, the service name as its alias on the network, the
              agent's container's memory, CPU and process limits, and `no-new-privileges` (HARDENING)
    agent     the rollout's container joins that network (its proxy still comes through its socket)

Services start before the agent's container and stay up through grading (Harbor's tests/test.sh may
query them after the agent); they are removed with the rollout's container, and by `forge gc`
(they carry the rollout's labels, the network too). Each rollout's network is its own: Docker's
isolation rules drop traffic between bridges, so no rollout reaches another's services. The agent
may change a service's state (it is the task's design, as in Harbor); it cannot exec into it.
"""

from __future__ import annotations

import re
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from openforge.errors import SandboxError
from openforge.sandbox.base import TransientSandboxError

NETWORK_PREFIX = "openforge-svc-"
SERVICE_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")  # Compose's service names, as DNS aliases
_NO_HOST_ADDRESS = {"com.docker.network.bridge.inhibit_ipv4": "true"}  # the bridge gets no host IP
# A service runs as its image says (a database's entrypoint starts as root and drops to its user, so the
# agent's container's cap_drop=ALL would break it), but the agent talks to it: a service it takes over gains
# no privilege through a setuid binary, and no raw sockets to forge traffic on the rollout's network.
DROPPED_CAPABILITIES = ["NET_RAW", "MKNOD", "SYS_CHROOT", "AUDIT_WRITE"]  # the Kubernetes backend drops the same
HARDENING = {"security_opt": ["no-new-privileges"], "cap_drop": DROPPED_CAPABILITIES}


class ComposeService(BaseModel):
    """One service of a task's compose file, as the Docker backend starts it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=SERVICE_NAME.pattern, description="the service's name: its host name for the agent")
    image: str = Field(min_length=1, description="an image the engine holds (a `build` is built into one at import)")
    command: list[str] | str | None = Field(None, description="the container's command (the image's when unset)")
    environment: dict[str, str] = Field(default_factory=dict, description="the service's environment variables")


def network_name(rollout_id: str) -> str:
    return f"{NETWORK_PREFIX}{rollout_id}"


def check_images(client: Any, services: list[ComposeService]) -> None:
    """SandboxError (one line) for the first service whose image the engine does not hold."""
    import docker.errors

    for service in services:
        try:
            client.images.get(service.image)
        except docker.errors.ImageNotFound:
            raise SandboxError(f"compose service {service.name}: image {service.image} is not on this machine and "
                               "forge runs offline (nothing is pulled): `docker load` it, or give the service a "
                               "`build` that `forge tasks import harbor` builds") from None


def start_services(client: Any, services: list[ComposeService], *, rollout_id: str, labels: dict[str, str],
                   internet: bool, limits: dict[str, Any], timeout_s: float = 60.0) -> str:
    """Make the rollout's network and start its services on it; returns the network's name. Each gets
    `limits` (host-config keys: the agent's container's memory, CPUs and processes, so a service the agent
    drives hard cannot take the host's) and is waited for until it runs (and, with a HEALTHCHECK in its
    image, is healthy); one that exits first is a SandboxError naming it with its last output."""
    import docker.errors

    check_images(client, services)
    remove_services(client, rollout_id)  # a failed attempt's, or a crashed run's, under the same names
    name = network_name(rollout_id)
    try:
        client.networks.create(name, driver="bridge", internal=not internet, labels=labels,
                               options={} if internet else _NO_HOST_ADDRESS)
    except docker.errors.APIError as exc:
        raise TransientSandboxError(f"cannot create the network {name} for the task's compose services: "
                                    f"{exc.explanation or exc}") from None
    api = client.api
    for service in services:
        try:
            cid = api.create_container(
                service.image, command=service.command, environment=service.environment, labels=labels,
                name=f"openforge-{rollout_id}-{service.name}", detach=True,
                host_config=api.create_host_config(network_mode=name, init=True, **limits, **HARDENING),
                networking_config=api.create_networking_config(
                    {name: api.create_endpoint_config(aliases=[service.name])}))["Id"]
            api.start(cid)
        except docker.errors.APIError as exc:
            raise SandboxError(f"compose service {service.name} could not start from {service.image}: "
                               f"{exc.explanation or exc}") from None
    deadline = time.monotonic() + timeout_s
    for service in services:
        _wait_ready(client, f"openforge-{rollout_id}-{service.name}", service, deadline)
    return name


def _wait_ready(client: Any, container: str, service: ComposeService, deadline: float) -> None:
    while True:
        state = client.api.inspect_container(container)["State"]
        health = (state.get("Health") or {}).get("Status")
        if state.get("Status") == "running" and health in (None, "healthy"):
            return
        if state.get("Status") in ("exited", "dead") or health == "unhealthy":
            tail = client.api.logs(container, tail=5).decode("utf-8", "replace").strip()[-300:]
            raise SandboxError(f"compose service {service.name} ({service.image}) "
                               f"{'is unhealthy' if health == 'unhealthy' else 'exited'} before the agent started"
                               + (f"; its last output: {tail}" if tail else ""))
        if time.monotonic() > deadline:
            raise SandboxError(f"compose service {service.name} ({service.image}) was not ready in time "
                               f"(state {state.get('Status')}, health {health})")
        time.sleep(0.2)


def remove_services(client: Any, rollout_id: str) -> None:
    """Remove the rollout's service containers (forced) and its network; what is already gone is fine."""
    import docker.errors

    name = network_name(rollout_id)
    for c in client.containers.list(all=True, filters={"network": name}):
        try:
            c.remove(force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: its removal is already in progress (`forge gc`, a stop beside this)
                raise SandboxError(f"could not remove {c.name}: {exc.explanation or exc}") from None
    deadline = time.monotonic() + 30
    while True:
        try:
            client.networks.get(name).remove()
            return
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as exc:  # a container still leaving it: wait for its removal to end
            if time.monotonic() > deadline:
                raise SandboxError(f"could not remove the network {name}: {exc.explanation or exc}") from None
            time.sleep(0.5)
