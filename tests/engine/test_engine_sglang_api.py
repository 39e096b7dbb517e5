"""engine/sglang_api.py, the one SGLang-API app every engine here serves (the embedded engine, the scripted one):
its `--api-key` check and its info and generate routes, over the scripted backend in-process."""

from __future__ import annotations

from pathlib import Path

import httpx

from openforge.engine.scripted import ScriptedEngine
from openforge.engine.sglang_api import ApiKeyMiddleware, create_sglang_app


async def test_every_route_but_health_needs_the_key(tiny_model: Path) -> None:
    engine = ScriptedEngine(tiny_model, lambda ids: "hello")
    app = create_sglang_app(engine, api_key="sk-test")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://engine") as client:
        assert (await client.get("/health")).status_code == 200  # a load balancer's probe carries no key
        assert (await client.get("/get_model_info")).status_code == 401
        assert (await client.get("/get_model_info", headers={"Authorization": "Bearer sk-wrong"})).status_code == 401
        info = await client.get("/get_model_info", headers={"Authorization": "Bearer sk-test"})
        assert info.status_code == 200 and info.json()["model_path"] == str(tiny_model)
        assert (await client.get("/v1/models", headers={"x-api-key": "sk-test"})).status_code == 200
        out = await client.post("/generate", headers={"Authorization": "Bearer sk-test"},
                                json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 8}})
        assert out.status_code == 200 and out.json()["text"].startswith("hello")


def test_the_key_check_compares_both_header_forms() -> None:
    check = ApiKeyMiddleware(app=None, api_key="k")  # type: ignore[arg-type]
    assert check.allowed("GET", "/metrics", {}) and check.allowed("OPTIONS", "/generate", {})
    assert check.allowed("POST", "/generate", {b"authorization": b"bearer k"})  # the scheme is case-free
    assert not check.allowed("POST", "/generate", {b"authorization": b"Basic k"})
    assert check.allowed("POST", "/generate", {b"x-api-key": b"k"}) and not check.allowed("POST", "/generate", {})
