"""EngineClient against the scripted engine over real loopback HTTP (its one transport, aiohttp):
shapes, streaming, typed faults, the engine key, the routing key, the keep-alive race."""

from __future__ import annotations

import contextlib

import asyncio
import socket

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

from openforge.engine.client import KEEPALIVE_EXPIRY_S, ROUTING_KEY_HEADER, EngineClient, _DeltaTracker
from openforge.engine.scripted import ScriptedEngine, scripted_logprob
from openforge.engine.serve import serve_in_thread
from openforge.errors import EngineError, EngineRejected, EngineTimeout, EngineUnavailable

TOOL_CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'


@pytest.fixture
def scripted(tiny_model):
    engine = ScriptedEngine(tiny_model, [TOOL_CALL, "All done.", "third one", "fourth one"])
    with serve_in_thread(engine.app) as server:
        yield engine, server.url


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_generate_returns_scripted_tokens_and_logprobs(scripted):
    engine, url = scripted
    async with EngineClient(url) as client:
        out = await client.generate([5, 6, 7], {"max_new_tokens": 64, "temperature": 1.0}, rid="r1")
    expected = engine.completion_ids(TOOL_CALL)
    assert out.output_ids == expected
    assert out.output_ids[-1] == engine.eos_id
    assert out.logprobs == [scripted_logprob(t, i) for i, t in enumerate(expected)]
    assert (out.finish_reason, out.matched_stop) == ("stop", engine.eos_id)
    assert (out.prompt_tokens, out.completion_tokens) == (3, len(expected))
    assert out.text == TOOL_CALL
    assert engine.requests[0]["input_ids"] == [5, 6, 7] and engine.requests[0]["rid"] == "r1"
    assert engine.requests[0]["return_logprob"] is True


@pytest.mark.parametrize("incremental", [False, True])
async def test_stream_yields_incremental_deltas(tiny_model, incremental):
    engine = ScriptedEngine(tiny_model, [TOOL_CALL, TOOL_CALL], incremental_stream=incremental)
    with serve_in_thread(engine.app) as server:
        async with EngineClient(server.url) as client:
            whole = await client.generate([1, 2], {"max_new_tokens": 64})
            deltas = [d async for d in client.stream_generate([1, 2], {"max_new_tokens": 64})]
    assert all(len(d.token_ids) == 1 for d in deltas)
    assert [t for d in deltas for t in d.token_ids] == whole.output_ids
    assert [lp for d in deltas for lp in d.logprobs] == whole.logprobs
    assert [d.finish_reason for d in deltas] == [None] * (len(deltas) - 1) + ["stop"]


async def test_max_new_tokens_and_stop_strings(scripted):
    engine, url = scripted
    async with EngineClient(url) as client:
        cut = await client.generate([1], {"max_new_tokens": 2})
        stopped = await client.generate([1], {"max_new_tokens": 64, "stop": [" done"]})
    assert cut.finish_reason == "length" and len(cut.output_ids) == 2
    assert cut.output_ids == engine.completion_ids(TOOL_CALL)[:2]
    assert (stopped.finish_reason, stopped.matched_stop, stopped.text) == ("stop", " done", "All")


async def test_engine_down_is_one_clear_error():
    url = f"http://127.0.0.1:{_free_port()}"
    async with EngineClient(url, retries=1) as client:
        with pytest.raises(EngineError, match=f"engine at {url} is down .*after 2 tries"):
            await client.generate([1], {})
        assert await client.health() is False
        with pytest.raises(EngineError, match="did not become healthy within 0.2s"):
            await client.wait_healthy(0.2)


async def test_http_500_and_bad_request_carry_status_and_body(scripted):
    engine, url = scripted
    engine.fail_next("http_500")
    async with EngineClient(url) as client:
        with pytest.raises(EngineError, match="HTTP 500: scripted fault: internal error"):
            await client.generate([1], {})
        with pytest.raises(EngineError, match="HTTP 400: top_p must be in"):
            await client.generate([1], {"top_p": 0})
        with pytest.raises(EngineError, match="HTTP 400: input_ids must be a non-empty list"):
            await client.generate([], {})


async def test_dropped_stream_and_timeout_are_engine_errors(scripted):
    engine, url = scripted
    engine.fail_next("disconnect", after_tokens=3)
    engine.fail_next("disconnect")
    engine.fail_next("delay", seconds=1.0)
    async with EngineClient(url, timeout=0.3) as client:
        got = []
        with pytest.raises(EngineError, match="stream broke"):
            async for d in client.stream_generate([1], {"max_new_tokens": 64}):
                got.extend(d.token_ids)
        assert got == engine.completion_ids(TOOL_CALL)[:3]
        with pytest.raises(EngineError, match=f"engine at {url}"):
            await client.generate([1], {})
        with pytest.raises(EngineError, match="did not answer /generate within 0.3s"):
            await client.generate([1], {})


async def test_lora_admin_calls(scripted):
    engine, url = scripted
    async with EngineClient(url) as client:
        out = await client.load_lora_adapter("step-1", "/tmp/adapter-1")
        assert out["loaded_adapters"] == {"step-1": "/tmp/adapter-1"}
        await client.generate([1], {}, lora_path="step-1")
        assert engine.requests[-1]["lora_path"] == "step-1"
        await client.unload_lora_adapter("step-1")
        with pytest.raises(EngineError, match="'step-1' is not loaded"):
            await client.unload_lora_adapter("step-1")
        with pytest.raises(EngineError, match="'step-1' is not loaded"):
            await client.generate([1], {}, lora_path="step-1")
        await client.flush_cache()
        await client.update_weights_from_disk("/ckpt/step-2")
        assert engine.weight_paths == ["/ckpt/step-2"]


def test_delta_tracker_reads_cumulative_incremental_and_abort_chunks():
    def chunk(ids, lps, total, finish=None):
        return {"output_ids": ids, "meta_info": {"completion_tokens": total, "finish_reason": finish,
                                                 "output_token_logprobs": [[lp, t, None] for lp, t in zip(lps, ids)]}}
    cumulative = _DeltaTracker()
    assert cumulative.delta(chunk([4, 5], [-1, -2], 2)).token_ids == [4, 5]
    d = cumulative.delta(chunk([4, 5, 6], [-1, -2, -3], 3, {"type": "length", "length": 3}))
    assert (d.token_ids, d.logprobs, d.finish_reason) == ([6], [-3.0], "length")
    incremental = _DeltaTracker()
    incremental.delta(chunk([4, 5], [-1, -2], 2))
    assert incremental.delta(chunk([6], [-3], 3)).logprobs == [-3.0]
    # SGLang's abort chunk repeats only the last token while completion_tokens counts them all.
    aborted = incremental.delta(chunk([6], [-3], 3, {"type": "abort", "message": "x"}))
    assert (aborted.token_ids, aborted.finish_reason) == ([], "abort")


# -- typed errors, the engine key, the routing key, the keep-alive race ------------------------------


async def test_the_routing_key_travels_as_a_header_on_generate_only(tiny_model):
    engine = ScriptedEngine(tiny_model, [TOOL_CALL, TOOL_CALL, TOOL_CALL])
    seen: list[str | None] = []

    async def record(request: Request, call_next):
        seen.append(request.headers.get(ROUTING_KEY_HEADER))
        return await call_next(request)

    app = Starlette(routes=[Mount("/", app=engine.app)])
    app.add_middleware(BaseHTTPMiddleware, dispatch=record)
    with serve_in_thread(app) as server:
        async with EngineClient(server.url) as client:
            await client.generate([1, 2], {"max_new_tokens": 4}, routing_key="r-1")
            _ = [d async for d in client.stream_generate([1, 2], {"max_new_tokens": 4}, routing_key="r-2")]
            await client.generate([1, 2], {"max_new_tokens": 4})
            await client.model_info()
    assert seen == ["r-1", "r-2", None, None]


async def test_errors_are_typed(tiny_model):
    engine = ScriptedEngine(tiny_model, ["ok"] * 4)
    with serve_in_thread(engine.app) as server:
        async with EngineClient(server.url, timeout=0.3) as client:
            engine.fail_next("http_500")
            with pytest.raises(EngineUnavailable, match="HTTP 500"):
                await client.generate([1], {})
            with pytest.raises(EngineRejected, match="top_p must be in") as refused:
                await client.generate([1], {"top_p": 0})
            assert refused.value.status == 400
            engine.fail_next("delay", seconds=1.0)
            with pytest.raises(EngineTimeout):
                await client.generate([1], {})
            engine.fail_next("disconnect", after_tokens=1)
            with pytest.raises(EngineUnavailable, match="stream"):
                async for _ in client.stream_generate([1], {"max_new_tokens": 8}):
                    pass
    async with EngineClient(f"http://127.0.0.1:{_free_port()}", retries=0) as down:
        with pytest.raises(EngineUnavailable, match="is down"):
            await down.generate([1], {})
    assert all(issubclass(e, EngineError) for e in (EngineTimeout, EngineUnavailable, EngineRejected))


def _requiring_key(app, key: str) -> Starlette:
    """`app` behind SGLang's --api-key check: 401 unless `Authorization: Bearer <key>`."""
    async def check(request: Request, call_next):
        if request.headers.get("authorization") != f"Bearer {key}":
            return JSONResponse({"error": {"message": "Unauthorized"}}, status_code=401)
        return await call_next(request)
    outer = Starlette(routes=[Mount("/", app=app)])
    outer.add_middleware(BaseHTTPMiddleware, dispatch=check)
    return outer


async def test_the_engine_key_travels_as_a_bearer_token(tiny_model):
    engine = ScriptedEngine(tiny_model, ["ok"])
    with serve_in_thread(_requiring_key(engine.app, "engine-secret")) as guarded:
        async with EngineClient(guarded.url, api_key="engine-secret") as client:
            assert (await client.generate([1], {})).text == "ok"
        async with EngineClient(guarded.url) as keyless:
            with pytest.raises(EngineRejected, match="HTTP 401") as refused:
                await keyless.generate([1], {})
    assert refused.value.status == 401


class _ClosesAsTheRequestArrives:
    """An HTTP/1.1 server that answers the first request on a connection with keep-alive, then,
    like a server whose keep-alive timer fired as the next request went out, reads that request and
    closes without answering. Every later connection is served normally."""

    BODY = b'{"context_length": 4096}'

    def __init__(self) -> None:
        self.connections = 0
        self.requests = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        first = self.connections == 1
        served = 0
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                self.requests += 1
                if first and served == 1:
                    return  # closed with the request unanswered
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(self.BODY), self.BODY))
                await writer.drain()
                served += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def test_a_kept_alive_connection_closed_under_a_request_is_retried_once():
    server = _ClosesAsTheRequestArrives()
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        async with EngineClient(f"http://127.0.0.1:{port}") as client:
            assert await client.model_info() == {"context_length": 4096}
            # Reuses the kept-alive connection, which the server closes under this request.
            assert await client.model_info() == {"context_length": 4096}
    finally:
        listener.close()
        await listener.wait_closed()
    assert (server.connections, server.requests) == (2, 3)


def test_idle_connections_expire_before_the_engines_keep_alive():
    import uvicorn

    engine_keep_alive = uvicorn.Config(app=None).timeout_keep_alive  # the embedded engine's and SGLang's server
    assert KEEPALIVE_EXPIRY_S < engine_keep_alive / 2


async def test_context_length_reads_what_the_engine_reports(tiny_model):
    def engine_with(path: str, info: dict) -> Starlette:
        return Starlette(routes=[Route(path, lambda r: JSONResponse(info), methods=["GET"])])

    async def ask(app) -> int | None:
        with serve_in_thread(app) as server:
            async with EngineClient(server.url) as client:
                return await client.context_length()

    assert await ask(engine_with("/model_info", {"context_length": 4096})) == 4096  # the embedded engine
    sglang = {"context_length": None, "max_total_num_tokens": 900_000, "max_req_input_len": 32767}
    assert await ask(engine_with("/get_server_info", sglang)) == 32768  # SGLang: its model's context
    assert await ask(engine_with("/get_server_info", {"context_length": 8192, "max_total_num_tokens": 6000})) == 6000
    assert await ask(engine_with("/get_model_info", {"model_path": "m"})) is None  # an older SGLang: none
    scripted = ScriptedEngine(tiny_model, [])
    assert await ask(scripted.app) == scripted.context_length


def test_server_stopping_under_a_running_request_logs_one_line_not_a_traceback() -> None:
    """uvicorn cancels a request still running when its graceful shutdown ends; that is logged as one
    line, not as "Exception in ASGI application" with a CancelledError traceback."""
    import asyncio
    import logging
    import threading

    entered = threading.Event()

    async def forever(request):  # noqa: ANN001, ANN202
        entered.set()
        await asyncio.sleep(3600)

    server = serve_in_thread(Starlette(routes=[Route("/slow", forever)]))
    caller = threading.Thread(target=_get_quietly, args=(server.url + "/slow",), daemon=True)
    caller.start()
    assert entered.wait(30)
    records: list[logging.LogRecord] = []
    catch = logging.Handler()
    catch.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("uvicorn.error")  # uvicorn's loggers do not propagate: listen on it
    logger.addHandler(catch)
    try:
        server.stop()
    finally:
        logger.removeHandler(catch)
    messages = [r.getMessage() for r in records]
    assert "a request in progress was cancelled as the server stopped" in messages
    assert not any(r.exc_info for r in records)
    assert not any("Exception in ASGI application" in m for m in messages)


def _get_quietly(url: str) -> None:
    with contextlib.suppress(httpx.HTTPError):
        httpx.get(url, timeout=60)
