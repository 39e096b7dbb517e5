"""The engine's credential (issue 13): SGLang's `--api-key` semantics on the one SGLang-API app.

With a key, every route but the probes (/health*, as SGLang's utils/auth.py decides) answers 401
`{"error": "Unauthorized"}` unless the request carries `Authorization: Bearer <key>` or
`x-api-key: <key>`. Checked on both backends of engine/sglang_api.py, over real loopback.
"""

from __future__ import annotations

import httpx
import pytest

from openforge.engine.embedded import EmbeddedEngine
from openforge.engine.scripted import ScriptedEngine
from openforge.engine.serve import serve_in_thread
from openforge.engine.sglang import sglang_command
from openforge.engine.supervisor import EngineProcess, engine_api_key
from openforge.config import EmbeddedEngineConfig, SglangEngineConfig, UrlEngineConfig
from openforge.errors import EngineError

KEY = "k3y-for-tests"
GUARDED = [("POST", "/generate", {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2, "temperature": 0}}),
           ("GET", "/model_info", None), ("GET", "/get_model_info", None), ("GET", "/server_info", None),
           ("GET", "/get_server_info", None), ("GET", "/v1/models", None),
           ("POST", "/load_lora_adapter", {"lora_name": "x", "lora_path": "/nonexistent"}),
           ("POST", "/unload_lora_adapter", {"lora_name": "x"}),
           ("POST", "/update_weights_from_disk", {"model_path": "/nonexistent"}), ("POST", "/flush_cache", None)]


@pytest.fixture(scope="module", params=["scripted", "embedded"])
def served(request, tiny_model):
    if request.param == "scripted":
        engine = ScriptedEngine(tiny_model, lambda ids: "ok", api_key=KEY)
    else:
        engine = EmbeddedEngine(EmbeddedEngineConfig(model=str(tiny_model), api_key=KEY))
    with serve_in_thread(engine.app) as server:
        yield server.url
    engine.close()


@pytest.mark.parametrize(("method", "path", "body"), GUARDED, ids=[p for _, p, _ in GUARDED])
def test_every_route_but_the_probes_needs_the_key(served, method, path, body):
    with httpx.Client(base_url=served, timeout=60) as http:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"x-api-key": "wrong"}):
            refused = http.request(method, path, json=body, headers=headers)
            assert (refused.status_code, refused.json()) == (401, {"error": "Unauthorized"}), headers
        for headers in ({"Authorization": f"Bearer {KEY}"}, {"Authorization": f"bearer {KEY}"}, {"x-api-key": KEY}):
            answered = http.request(method, path, json=body, headers=headers)
            assert answered.status_code != 401, headers


def test_probes_answer_without_the_key(served):
    with httpx.Client(base_url=served, timeout=60) as http:
        assert http.get("/health").status_code == 200
        assert http.get("/health_generate").status_code == 200


def test_no_key_means_no_check(tiny_model):
    with serve_in_thread(ScriptedEngine(tiny_model, lambda ids: "ok").app) as server:
        assert httpx.get(server.url + "/model_info").status_code == 200


def test_run_keys_and_the_sglang_flag():
    made = {engine_api_key(EmbeddedEngineConfig()) for _ in range(3)}
    assert len(made) == 3 and all(len(k) >= 32 for k in made)  # fresh and unguessable per run
    assert engine_api_key(EmbeddedEngineConfig(api_key="mine")) == "mine"
    assert engine_api_key(UrlEngineConfig(url="http://h:1")) == ""  # not ours to invent
    cmd = sglang_command(SglangEngineConfig(), model_path="/m", port=1, api_key="s3cret")
    assert cmd[cmd.index("--api-key") + 1] == "s3cret"
    assert "--api-key" not in sglang_command(SglangEngineConfig(), model_path="/m", port=1)


def test_a_url_engine_with_another_key_is_refused_at_start(tiny_model):
    with serve_in_thread(ScriptedEngine(tiny_model, ["x"], api_key=KEY).app) as server:
        for key, match in (("wrong", "refused the key forge holds"), ("", "refused no key")):
            config = UrlEngineConfig(url=server.url, api_key=key, startup_timeout_s=5)
            with pytest.raises(EngineError, match=match):
                EngineProcess(config).start()
        EngineProcess(UrlEngineConfig(url=server.url, api_key=KEY, startup_timeout_s=5)).start()
