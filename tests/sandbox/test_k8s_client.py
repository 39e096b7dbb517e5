"""sandbox/k8s_client.py: one ClusterClient per cluster and data dir, shared by every pod, closed once the last
sandbox lets go; its calls retry the API server's throttling (429/503) and nothing else."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kubernetes.client import ApiException, Configuration

from openforge.config import KubernetesSandboxConfig
from openforge.sandbox import k8s_client
from openforge.sandbox.k8s_client import ClusterClient


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(k8s_client, "IDLE_CLOSE_S", 0.05)
    monkeypatch.setattr(k8s_client, "backoff_s", lambda attempt, retry_after: 0.0)


def test_one_client_is_shared_and_closed_after_the_last_release(tmp_path: Path) -> None:
    k8s = KubernetesSandboxConfig(max_threads=4)
    made: list[int] = []
    load = lambda: made.append(1) or Configuration()  # noqa: E731
    first = ClusterClient.acquire(k8s, tmp_path, load)
    second = ClusterClient.acquire(k8s, tmp_path, load)
    other_home = ClusterClient.acquire(k8s, tmp_path / "other", load)
    assert first is second and other_home is not first and len(made) == 2
    first.release()
    time.sleep(0.2)
    assert not second._closed  # one holder is left
    second.release()
    other_home.release()
    deadline = time.monotonic() + 5
    while not first._closed and time.monotonic() < deadline:
        time.sleep(0.02)
    assert first._closed
    again = ClusterClient.acquire(k8s, tmp_path, load)  # the next step makes a new one
    assert again is not first and len(made) == 3
    again.release()


async def test_throttling_is_retried_and_a_refusal_is_not(tmp_path: Path) -> None:
    client = ClusterClient.acquire(KubernetesSandboxConfig(max_threads=4), tmp_path, Configuration)
    try:
        answers = [ApiException(status=429), ApiException(status=503), "pod"]

        def create() -> str:
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

        assert await client.call("create", create, create=True) == "pod"
        assert client.calls["create"] == 3 and client.calls["throttled"] == 2

        def forbidden() -> None:
            raise ApiException(status=403)

        with pytest.raises(ApiException):
            await client.call("get", forbidden)
        assert client.calls["get"] == 1
    finally:
        client.release()
