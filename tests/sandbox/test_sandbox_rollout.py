"""The same rollout (a built-in task + the `mini` harness + one scripted policy) runs unchanged on every
sandbox backend that runs here: ScriptedEngine -> real proxy on loopback -> RolloutRunner -> sandbox."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from openforge.engine.scripted import ScriptedEngine
from openforge.engine.serve import serve_in_thread
from openforge.config import ForgeConfig
from openforge.store import Store
from openforge.proxy.server import ProxyServer
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import load_tasks
from openforge.sandbox.testing import backend_config, proxy_socket_path, sandbox_backends
from tests.helpers.required import skip_or_fail

pytestmark = pytest.mark.timeout(120)
WRITE_HELLO = ('<tool_call>\n{"name": "write_file", "arguments": {"path": "hello.txt", '
               '"content": "hello world\\n"}}\n</tool_call>')


@pytest.fixture
def proxy(tiny_model: Path, store: Store) -> Iterator[ProxyServer]:
    engine = ScriptedEngine(tiny_model, [WRITE_HELLO, "Done: hello world"])
    eng = serve_in_thread(engine.app)
    proxy = ProxyServer(ForgeConfig().proxy, store_path=store.path, engine_url=eng.url, model_path=tiny_model,
                        uds=proxy_socket_path())
    proxy.start()
    yield proxy
    proxy.stop()
    eng.stop()


@pytest.mark.parametrize("backend", sandbox_backends())
def test_same_rollout_on_every_backend(backend: str, proxy: ProxyServer, store: Store) -> None:
    sandbox, why = backend_config(backend, image="python")  # the mini agent needs python3 + openai
    if sandbox is None:
        skip_or_fail(backend, why)  # only "docker" can be required (CI installs it)
    cfg = ForgeConfig(sandbox=sandbox)
    task = next(t for t in load_tasks("builtin") if t.id == "med-create-file")
    run = store.create_run(kind="eval")
    [ro] = asyncio.run(RolloutRunner(store, config=cfg, proxy_url=proxy.url, proxy_socket=proxy.uds).run(run.id, [RolloutSpec(task)]))
    assert (ro.status, ro.reward, ro.exit_code) == ("scored", 1.0, 0), (ro.error, ro.stderr[-2000:])
    calls = store.list_calls(rollout_id=ro.id)
    assert [c.status for c in calls] == ["ok", "ok"]
    assert len(store.list_trajectories(rollout_ids=[ro.id])) == 1
