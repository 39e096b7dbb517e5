"""The rig the rollout-overhead benches share: a tiny model, a scripted engine (one `write_file` call, then
the answer), the real proxy and a store, in a fresh FORGE_HOME; `rollout_seconds` times one graded rollout
of `mini` through a RolloutRunner, and `alternate` times two variants in alternating rounds (load on a
shared machine falls on both alike). Used by bench/harness_spec.py and bench/task_tools.py."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WRITE_HELLO = ('<tool_call>\n{"name": "write_file", "arguments": {"path": "hello.txt", '
               '"content": "hello world\\n"}}\n</tool_call>')


@dataclass
class MiniRig:
    home: Path
    store: Any  # openforge.store.Store
    proxy: Any  # openforge.proxy.server.ProxyServer
    config: Any  # openforge.config.ForgeConfig


@contextlib.contextmanager
def mini_rig() -> Iterator[MiniRig]:
    """A fresh FORGE_HOME with the rig running in it; everything stopped on exit."""
    from transformers import AutoTokenizer

    from openforge.config import ForgeConfig
    from openforge.engine.scripted import ScriptedEngine
    from openforge.engine.serve import serve_in_thread
    from openforge.engine.tiny import build_tiny_model
    from openforge.proxy.server import ProxyServer
    from openforge.sandbox.testing import proxy_socket_path
    from openforge.store import Store

    with tempfile.TemporaryDirectory() as home:
        os.environ["FORGE_HOME"] = home
        model = build_tiny_model(Path(home) / "tiny")
        tokenizer = AutoTokenizer.from_pretrained(str(model))

        def script(prompt_ids: list[int]) -> str:  # the tool call, then the answer once its result is in
            return "Done: hello world" if "wrote 12 characters" in tokenizer.decode(prompt_ids[-200:]) else WRITE_HELLO

        store = Store(Path(home) / "forge.db")
        engine = serve_in_thread(ScriptedEngine(model, script).app)
        config = ForgeConfig()
        proxy = ProxyServer(config.proxy, store_path=store.path, engine_url=engine.url, model_path=model,
                            uds=proxy_socket_path())
        proxy.start()
        try:
            yield MiniRig(Path(home), store, proxy, config)
        finally:
            proxy.stop()
            engine.stop()
            store.close()


def rollout_seconds(store: Any, runner: Any, task: Any) -> float:
    """Wall time of one rollout of `task` through `runner`; it must be scored 1.0."""
    from openforge.rollouts.runner.runner import RolloutSpec

    run = store.create_run(kind="eval")
    t0 = time.perf_counter()
    [ro] = asyncio.run(runner.run(run.id, [RolloutSpec(task)]))
    elapsed = time.perf_counter() - t0
    assert (ro.status, ro.reward) == ("scored", 1.0), (ro.status, ro.error, ro.stderr)
    return elapsed


def alternate(measure: dict[str, Callable[[], float]], *, rounds: int, per_round: int) -> dict[str, list[float]]:
    """Each variant's timings: `rounds` rounds of `per_round` each, the order flipped every round."""
    names = list(measure)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        for name in (names if i % 2 == 0 else names[::-1]):
            times[name] += [measure[name]() for _ in range(per_round)]
    return times
