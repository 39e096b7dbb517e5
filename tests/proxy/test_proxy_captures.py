"""Replay the requests real harnesses sent (docs/harness-captures/, recorded from Claude Code, Codex
and OpenClaw) through the proxy in-process: each must get a 200 and a complete stream."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from transformers import AutoTokenizer

from openforge.engine.client import EngineClient
from openforge.engine.scripted import ScriptedEngine
from openforge.engine.serve import serve_in_thread
from openforge.config import ProxyConfig
from openforge.proxy.app import create_app
from tests.helpers.proxy_rig import CAPTURES, _captured

END = {"/v1/messages": "event: message_stop", "/v1/responses": "event: response.completed",
       "/v1/chat/completions": "data: [DONE]"}
pytestmark = pytest.mark.timeout(120)


@pytest.mark.skipif(not CAPTURES.is_dir(), reason="docs/harness-captures/ is not in this checkout")
def test_every_captured_harness_request_is_served(tiny_model, store):
    run = store.create_run(kind="proxy")
    ro = store.create_rollout(run_id=run.id, task_id="t", status="running")
    engine = ScriptedEngine(tiny_model, lambda ids: "Done.")

    async def replay(url: str) -> list[tuple[str, dict, httpx.Response]]:
        app = create_app(ProxyConfig(), store_path=store.path, engine=EngineClient(url, timeout=20),
                         tokenizer=AutoTokenizer.from_pretrained(str(tiny_model)))
        out = []
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as http:
            for name, req in _captured():
                headers = {k: v for k, v in req["headers"].items() if k in ("anthropic-version", "accept")}
                # The captured credential's form (x-api-key or bearer), with this rollout's key.
                if "x-api-key" in req["headers"]:
                    headers["x-api-key"] = ro.key
                else:
                    headers["authorization"] = f"Bearer {ro.key}"
                query = f"?{req['query']}" if req["query"] else ""
                resp = await http.request(req["method"], req["path"] + query, headers=headers, json=req["body"])
                out.append((name, req, resp))
        await app.state.proxy.aclose()
        return out

    with serve_in_thread(engine.app) as es:
        results = asyncio.run(replay(es.url))
    posts = [(n, r, resp) for n, r, resp in results if r["method"] == "POST"]
    assert {n for n, _, _ in posts} >= {"claude-code", "codex"} and len(posts) >= 6
    for name, req, resp in results:
        assert resp.status_code == 200, (name, resp.text[:300])
        if req["method"] == "POST":
            assert END[req["path"]] in resp.text, (name, resp.text[-300:])
    calls = store.list_calls(rollout_id=ro.id)
    assert len(calls) == len(posts) and all(c.status == "ok" for c in calls)
    assert all('"Done."' in json.dumps(c.response_json) for c in calls)  # the served answer, as each API shapes it
    tok = engine.tokenizer
    codex = [c for c in calls if c.api == "openai_responses"][0]
    prompt = tok.decode(codex.prompt_ids)
    assert "exec_command" in prompt and "spawn_agent" in prompt  # a namespace's functions are offered
    assert '"web_search"' not in prompt  # a hosted tool is not
