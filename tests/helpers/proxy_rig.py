"""Shared pieces of the proxy tests: a scripted engine + the real proxy on loopback, and tool specs.

(No tests here; the test_proxy_*.py modules import these fixtures.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from openforge.engine.scripted import ScriptedEngine
from openforge.engine.serve import ServerHandle, serve_in_thread
from openforge.config import ProxyConfig
from openforge.store import Rollout, Store
from openforge.proxy.server import ProxyServer
from tests.helpers.paths import REPO


BASH_SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
CHAT_TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command",
                                                 "parameters": BASH_SCHEMA}}]
ANTHROPIC_TOOLS = [{"name": "bash", "description": "Run a shell command", "input_schema": BASH_SCHEMA}]
RESPONSES_TOOLS = [{"type": "function", "name": "bash", "description": "Run a shell command",
                    "parameters": BASH_SCHEMA}]
# The model writes compact JSON; chat templates re-render it with spaces: re-tokenising would drift.
TOOL_TURN = 'Let me look.\n<tool_call>\n{"name":"bash","arguments":{"command":"ls"}}\n</tool_call>'


@dataclass
class Rig:
    engine: ScriptedEngine
    engine_server: ServerHandle
    proxy: ProxyServer
    store: Store
    rollout: Rollout
    model_path: Path

    @property
    def url(self) -> str:
        return self.proxy.url

    @property
    def key(self) -> str:
        return self.rollout.key

    def new_rollout(self, status: str = "running") -> Rollout:
        return self.store.create_rollout(run_id=self.rollout.run_id, task_id="t", status=status)

    def calls(self, rollout_id: str | None = None) -> list[Any]:
        return self.store.list_calls(rollout_id=rollout_id or self.rollout.id)

    def served_texts(self, rollout_id: str | None = None) -> list[str]:
        tok = self.engine.tokenizer
        return [tok.decode(c.completion_ids, skip_special_tokens=True)
                for c in self.calls(rollout_id) if c.status == "ok"]


@pytest.fixture
def make_rig(tiny_model: Path, store: Store) -> Iterator[Any]:
    """make_rig(script, **proxy_config) -> Rig; everything is stopped at the end of the test."""
    started: list[Rig] = []

    def make(script: Any, *, token_delay_s: float = 0.0, uds: Path | None = None, engine_key: str = "",
             proxy_engine_key: str | None = "", **config: Any) -> Rig:
        """`engine_key`: the engine requires it; the proxy holds it too unless `proxy_engine_key` says otherwise."""
        engine = ScriptedEngine(tiny_model, script, token_delay_s=token_delay_s, api_key=engine_key)
        held = engine_key if proxy_engine_key == "" else proxy_engine_key
        es = serve_in_thread(engine.app)
        run = store.create_run(kind="proxy")
        rollout = store.create_rollout(run_id=run.id, task_id="t", status="running")
        proxy = ProxyServer(ProxyConfig(**config), store_path=store.path, engine_url=es.url,
                            model_path=tiny_model, uds=uds, engine_key=held or None).start()
        rig = Rig(engine, es, proxy, store, rollout, tiny_model)
        started.append(rig)
        return rig

    yield make
    for rig in started:
        rig.proxy.stop()
        rig.engine_server.stop()


def tool_args(call: Any) -> dict[str, Any]:
    return json.loads(call.function.arguments)


CAPTURES = REPO / "docs" / "harness-captures"


def _captured(*, images: bool = False) -> list[tuple[str, dict]]:
    """The captured requests without images (served here by the text model), or only those with
    images (the GUI harnesses': tests/proxy/test_vl_proxy.py serves them with the tiny VLM)."""
    out = [(f.stem, json.loads(line)) for f in sorted(CAPTURES.glob("*.jsonl")) for line in f.open()]
    return [(n, r) for n, r in out if ('"data:image/' in json.dumps(r.get("body"))) == images]
