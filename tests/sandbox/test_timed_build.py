"""sandbox/timed_build.py over a stand-in for the docker SDK's low-level API (no Docker engine here; the real
one builds every image in tests/sandbox/test_harness_images.py): the build log, the engine's errors, and a
build past its deadline whose step containers are removed before BuildTimedOut."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import docker.errors
import pytest

from openforge.sandbox.timed_build import BuildTimedOut, build_image

CID = "0123456789ab" * 2


class _Api:
    """The parts of docker.APIClient that build_image uses: `build` (a stream of decoded events), the requests
    session's response hooks, and `remove_container`."""

    def __init__(self, events: list[dict[str, Any]], *, linger_s: float = 0.0) -> None:
        self.events, self.linger_s = events, linger_s
        self.hooks: dict[str, list] = {"response": []}
        self.removed: list[str] = []
        self.asked: dict[str, Any] = {}

    def build(self, **kw: Any) -> Iterator[dict[str, Any]]:
        self.asked = kw
        yield from self.events
        time.sleep(self.linger_s)  # the engine still building when the deadline comes

    def remove_container(self, cid: str, force: bool) -> None:
        if cid in self.removed:
            raise docker.errors.NotFound("gone")
        self.removed.append(cid)


class _Client:
    def __init__(self, api: _Api) -> None:
        self.api = api


def test_a_finished_build_returns_its_log() -> None:
    api = _Api([{"stream": "Step 1/2 : FROM python"}, {"stream": f" ---> Running in {CID}\n"},
                {"aux": {"ID": "sha256:abc"}}, {"stream": "Successfully built abc123\n"}])
    log = build_image(_Client(api), timeout_s=5, path="ctx", tag="x:1")
    assert len(log) == 4 and api.asked == {"decode": True, "path": "ctx", "tag": "x:1"}
    assert api.hooks["response"] == [] and api.removed == []  # its hook is gone, nothing removed


def test_the_engines_errors_are_the_sdks_build_errors() -> None:
    with pytest.raises(docker.errors.BuildError, match="no space left"):
        build_image(_Client(_Api([{"stream": "Step 1/2"}, {"error": "no space left on device"}])), timeout_s=5)
    with pytest.raises(docker.errors.BuildError):  # a stream that ends without an image built
        build_image(_Client(_Api([{"stream": "Step 1/2"}])), timeout_s=5)


def test_a_build_past_its_deadline_removes_its_containers_and_says_so() -> None:
    api = _Api([{"stream": f" ---> Running in {CID}\n"}], linger_s=0.6)
    with pytest.raises(BuildTimedOut, match="ran past 0.1s"):
        build_image(_Client(api), timeout_s=0.1)
    assert api.removed == [CID]
