"""ProxyServer's listeners: TCP and a unix socket serving one app, and deadlines on reading requests."""

from __future__ import annotations

import http.client
import socket
import stat
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.helpers.proxy_rig import make_rig  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(60)


def test_one_app_serves_tcp_and_a_unix_socket(make_rig, tmp_path: Path):
    sock_path = tmp_path / "proxy.sock"
    rig = make_rig(["over tcp", "over the socket"], uds=sock_path)
    assert stat.S_ISSOCK(sock_path.stat().st_mode)
    msgs = [{"role": "user", "content": "hi"}]
    tcp = openai.OpenAI(base_url=rig.url + "/v1", api_key=rig.key, max_retries=0)
    assert tcp.chat.completions.create(model="m", messages=msgs).choices[0].message.content == "over tcp"
    # A sandbox without a network has only the socket: the real SDK over it, same app, same store.
    over_uds = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock_path)))
    uds = openai.OpenAI(base_url="http://proxy/v1", api_key=rig.key, max_retries=0, http_client=over_uds)
    assert uds.chat.completions.create(model="m", messages=msgs).choices[0].message.content == "over the socket"
    assert [c.status for c in rig.calls()] == ["ok", "ok"]
    rig.proxy.stop()
    assert not sock_path.exists()  # removed with the server


def test_a_stale_socket_file_is_replaced(make_rig, tmp_path: Path):
    sock_path = tmp_path / "proxy.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(sock_path))  # left by a proxy that died: nobody listens
    stale.close()
    rig = make_rig([], uds=sock_path)
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock_path))) as http:
        assert http.get("http://proxy/health").json()["status"] == "ok"
    assert rig.proxy.uds == str(sock_path)


def _trickle(url: str, payload: bytes, every_s: float, budget_s: float) -> tuple[float, bool]:
    """Send `payload` one byte per `every_s`; returns (seconds until the server closed, closed?)."""
    host, port = url.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)))
    conn.settimeout(every_s)
    start = time.monotonic()
    try:
        for byte in payload:
            if time.monotonic() - start > budget_s:
                return time.monotonic() - start, False
            conn.sendall(bytes([byte]))
            try:
                if conn.recv(1024) == b"":  # EOF: the server closed it
                    return time.monotonic() - start, True
            except TimeoutError:
                pass
            except ConnectionResetError:
                return time.monotonic() - start, True
        return time.monotonic() - start, False
    except (BrokenPipeError, ConnectionResetError):
        return time.monotonic() - start, True
    finally:
        conn.close()


@pytest.mark.parametrize("part", ["headers", "body"])
def test_slow_loris_connections_are_closed(make_rig, part):
    rig = make_rig([], read_timeout_s=1.0)
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {rig.key}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n").encode()
    if part == "body":  # the headers at once, then the body a byte at a time
        host, port = rig.url.removeprefix("http://").split(":")
        conn = socket.create_connection((host, int(port)))
        conn.sendall(head)
        conn.settimeout(0.2)
        start, closed = time.monotonic(), False
        for byte in body:
            try:
                conn.sendall(bytes([byte]))
                if conn.recv(4096) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
        waited = time.monotonic() - start
        conn.close()
    else:  # the server keeps waiting for headers that never end; each byte used to reset the clock
        waited, closed = _trickle(rig.url, head * 10, every_s=0.2, budget_s=15)
    assert closed and waited < 10
    assert rig.calls() == []
    # The server is fine for everyone else.
    assert httpx.get(rig.url + "/health", timeout=5).status_code == 200


def test_a_slow_but_steady_stream_is_not_cut(make_rig):
    """The deadline bounds reading the request only: a long streamed answer runs past it."""
    rig = make_rig(lambda ids: "one two three four five six seven eight", token_delay_s=0.25, read_timeout_s=1.0)
    with httpx.Client(base_url=rig.url, headers={"authorization": f"Bearer {rig.key}"}, timeout=20) as http:
        resp = http.post("/v1/chat/completions", json={"model": "m", "stream": True,
                                                        "messages": [{"role": "user", "content": "hi"}]})
        assert resp.status_code == 200 and "[DONE]" in resp.text
        time.sleep(1.5)  # an idle kept-alive connection outlives the read deadline (keep-alive bounds it)
        again = http.get("/health")
        assert again.status_code == 200
    assert [c.status for c in rig.calls()] == ["ok"]


def _get_health(conn: http.client.HTTPConnection) -> int:
    conn.request("GET", "/health")
    resp = conn.getresponse()
    resp.read()
    return resp.status


def test_an_idle_kept_alive_connection_outlives_common_client_expiries(make_rig):
    """uvicorn closes idle connections after 5 s, the keep-alive expiry of httpx (so of the OpenAI and
    Anthropic SDKs): a client reusing a connection idle for ~5 s raced the close and got no answer.
    The proxy keeps them KEEP_ALIVE_S, past its read deadline too; a request begun on a kept-alive
    connection still has only read_timeout_s to arrive."""
    rig = make_rig([], read_timeout_s=1.0)
    host, port = rig.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        assert _get_health(conn) == 200
        first = conn.sock
        time.sleep(5.5)
        assert _get_health(conn) == 200  # a closed connection raises RemoteDisconnected here
        assert conn.sock is first  # the same connection, not a new one
        conn.sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n")  # a request begun, never finished
        start = time.monotonic()
        assert conn.sock.recv(1024) == b"" and time.monotonic() - start < 5  # closed by the read deadline
    finally:
        conn.close()


@pytest.mark.slow
def test_the_openai_sdk_reuses_connections_idle_about_5s_without_errors(make_rig):
    """The real SDK (httpx, 5 s expiry), pausing around 5 s between calls, never retried: every call answered."""
    rig = make_rig(["ok"] * 6)
    client = openai.OpenAI(base_url=rig.url + "/v1", api_key=rig.key, max_retries=0)
    msgs = [{"role": "user", "content": "hi"}]
    assert client.chat.completions.create(model="m", messages=msgs).choices[0].message.content == "ok"
    for pause in (4.95, 4.999, 5.0, 5.05, 5.1):
        time.sleep(pause)
        assert client.chat.completions.create(model="m", messages=msgs).choices[0].message.content == "ok"
    client.close()
    assert [c.status for c in rig.calls()] == ["ok"] * 6
