"""An image build on the engine's classic builder (`POST /build`, the docker SDK) that ends at a deadline.

    build_image(client, timeout_s=600, path=ctx, dockerfile="Dockerfile", tag="x:1", network_mode="none")

The SDK's `images.build` cannot be stopped part-way: it blocks in a read of the build's stream for as
long as the engine builds. Here the stream is read on a thread, and at the deadline the connection is
shut down under it (urllib3's `HTTPResponse.shutdown`, which unblocks that read). The engine takes a
client that went away as the build cancelled: it kills and removes the step's container, and tags
nothing (the tag is written only when the last step succeeds). forge does not take that on trust:
the containers the stream named (`Running in ID`) are removed by force and waited for before
`BuildTimedOut` is raised. The steps that finished stay as the engine's untagged build cache, as
they do after any build.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit

_RUNNING = re.compile(r"^\s*---> Running in ([0-9a-f]{12,64})\s*$")
_BUILT = re.compile(r"(^Successfully built |sha256:)([0-9a-f]+)$")
CLEANUP_WAIT_S = 60.0  # how long the engine may take to remove a cancelled step's container


class BuildTimedOut(Exception):
    """The build ran past its deadline: stopped, nothing tagged, its containers removed."""


def build_image(client: Any, *, timeout_s: float | None = None, **build: Any) -> list[dict[str, Any]]:
    """Build as `client.images.build(**build)` does and return the engine's build log (one dict an
    event); docker.errors.BuildError / APIError as it raises them; BuildTimedOut past `timeout_s`."""
    import docker.errors

    log: list[dict[str, Any]] = []
    containers: list[str] = []
    responses: list[Any] = []
    outcome: dict[str, BaseException] = {}
    worker: threading.Thread | None = None

    def keep(response: Any, **_: Any) -> None:  # requests' response hook: runs on the thread that asked
        if threading.current_thread() is worker and urlsplit(response.url).path.endswith("/build"):
            responses.append(response)

    def run() -> None:
        try:
            last: Any = None
            built = False
            for event in client.api.build(decode=True, **build):
                log.append(event)
                if "error" in event:
                    raise docker.errors.BuildError(event["error"], log)
                stream = str(event.get("stream") or "")
                if match := _RUNNING.match(stream):
                    containers.append(match.group(1))
                built = built or bool(_BUILT.search(stream.strip())) or bool((event.get("aux") or {}).get("ID"))
                last = event
            if not built:
                raise docker.errors.BuildError(last or "Unknown", log)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread as it is
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="forge-image-build", daemon=True)
    client.api.hooks["response"].append(keep)
    try:
        worker.start()
        worker.join(timeout_s)
        if worker.is_alive():
            while worker.is_alive():  # the request may not have its response yet: cut it once it has
                for response in responses:
                    _cut(response)
                worker.join(0.2)
            _remove(client, containers)
            raise BuildTimedOut(f"the build ran past {timeout_s:g}s")
    finally:
        client.api.hooks["response"].remove(keep)
    if "error" in outcome:
        raise outcome["error"]
    return log


def _cut(response: Any) -> None:
    """Shut down the connection a thread is blocked reading: urllib3 >= 2.3 has `shutdown` for it; before,
    the socket under the response, reached as the docker SDK reaches it (`_get_raw_response_socket`)."""
    raw = response.raw
    if hasattr(raw, "shutdown"):
        raw.shutdown()
        return
    sock = getattr(raw._fp.fp.raw, "_sock", raw._fp.fp.raw)
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _remove(client: Any, containers: list[str]) -> None:
    """Remove a cancelled build's containers (the engine is doing the same) and wait until they are gone."""
    import docker.errors

    deadline = time.monotonic() + CLEANUP_WAIT_S
    for cid in containers:
        while time.monotonic() < deadline:
            try:
                client.api.remove_container(cid, force=True)
            except docker.errors.NotFound:
                break
            except docker.errors.APIError:  # 409: the engine's own removal is under way
                pass
            time.sleep(0.2)
