"""A scripted engine behind the real proxy on loopback, as the mini harness's tests serve it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from openforge.engine.scripted import ScriptedEngine
from openforge.engine.serve import serve_in_thread
from openforge.config import ForgeConfig
from openforge.store import Store
from openforge.proxy.server import ProxyServer
from openforge.sandbox.testing import proxy_socket_path


@pytest.fixture
def serve(tiny_model: Path, store: Store) -> Iterator:
    """serve(script) -> (proxy, engine): a ScriptedEngine behind the real proxy, on loopback and on a unix
    socket (the sandbox's one way out)."""
    handles = []

    def start(script, **proxy_config) -> tuple[str, ScriptedEngine]:  # noqa: ANN001, ANN003
        engine = ScriptedEngine(tiny_model, script)
        eng = serve_in_thread(engine.app)
        proxy = ProxyServer(ForgeConfig().proxy.model_copy(update=proxy_config), store_path=store.path,
                            engine_url=eng.url, model_path=tiny_model, uds=proxy_socket_path())
        handles.extend([eng, proxy])
        proxy.start()
        return proxy, engine

    yield start
    for h in reversed(handles):
        h.stop()
