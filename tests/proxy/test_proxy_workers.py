"""Many proxy workers on one store: a rollout's calls may reach any worker, and its recording stays
exact (each prompt extends the previous call's sampled ids) and ordered (seq 0..n-1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from openforge.engine.client import EngineClient
from openforge.engine.scripted import ScriptedEngine
from openforge.engine.serve import serve_in_thread
from openforge.config import ProxyConfig
from openforge.store import Store
from openforge.proxy.app import create_app
from openforge.proxy.tokens import load_tokenizer
from tests.helpers.proxy_rig import CHAT_TOOLS, TOOL_TURN, make_rig  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(240)


def _next_turn(msgs: list[dict[str, Any]], answer: dict[str, Any], turn: int) -> list[dict[str, Any]]:
    message = {k: v for k, v in answer["choices"][0]["message"].items() if v is not None}
    call_id = message["tool_calls"][0]["id"]
    return [*msgs, message, {"role": "tool", "tool_call_id": call_id, "content": f"file{turn}.txt"}]


def _extends_exactly(calls: list[Any]) -> list[bool]:
    """For each call after the first: does its prompt start with the previous prompt + sampled ids?"""
    return [b.prompt_ids[:len(a.prompt_ids) + len(a.completion_ids)] == a.prompt_ids + a.completion_ids
            for a, b in zip(calls, calls[1:])]


@pytest.mark.parametrize("shared_store", [True, False])
async def test_a_rollout_alternating_between_two_workers_keeps_exact_tokens(tiny_model: Path, store: Store,
                                                                            shared_store: bool):
    """Two proxy apps on one store, turns served alternately. A worker that has not seen the latest
    turn reloads the rollout's turns from the store; without that check (shared_store=False) it
    splices an older turn and re-tokenises the newer answer, which drifts (the template re-spaces
    the tool call's JSON): the control case shows the test can tell."""
    engine = ScriptedEngine(tiny_model, [TOOL_TURN] * 4)
    served = serve_in_thread(engine.app)
    tokenizer = load_tokenizer(tiny_model)
    clients = [EngineClient(served.url) for _ in range(2)]
    apps = [create_app(ProxyConfig(), store_path=store.path, tokenizer=tokenizer, recover=False,
                       shared_store=shared_store, engine=client) for client in clients]
    rollout = store.create_rollout(run_id=store.create_run(kind="proxy").id, task_id="t", status="running")
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "list the files"}]
    try:
        for turn in range(4):
            app = apps[turn % 2]
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy",
                                         headers={"authorization": f"Bearer {rollout.key}"}, timeout=60) as http:
                resp = await http.post("/v1/chat/completions", json={"model": "m", "messages": msgs,
                                                                      "tools": CHAT_TOOLS})
            assert resp.status_code == 200, resp.text
            msgs = _next_turn(msgs, resp.json(), turn)
    finally:
        for app, client in zip(apps, clients):
            await app.state.proxy.aclose()
            await client.aclose()
        served.stop()
    calls = store.list_calls(rollout_id=rollout.id)
    assert [c.seq for c in calls] == [0, 1, 2, 3] and {c.status for c in calls} == {"ok"}
    if shared_store:
        assert _extends_exactly(calls) == [True, True, True]
    else:
        assert _extends_exactly(calls)[1:] == [False, False]  # turns 2, 3: the other worker's answer re-tokenised


@pytest.mark.slow
def test_two_worker_processes_serve_one_port_and_socket(make_rig, tmp_path: Path):
    """`proxy.workers = 2`: both listeners served, a rollout's turns over fresh connections (so
    spread over both processes) recorded exactly and in order, and stop() ends the workers."""
    sock = tmp_path / "proxy.sock"
    rig = make_rig([TOOL_TURN] * 6, workers=2, uds=sock)
    assert rig.proxy.app is None and rig.proxy._workers.alive() == 2
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "list the files"}]
    for turn in range(6):
        transport = httpx.HTTPTransport(uds=str(sock)) if turn % 2 else None
        with httpx.Client(base_url=rig.url, transport=transport, timeout=60,
                          headers={"authorization": f"Bearer {rig.key}"}) as http:
            resp = http.post("/v1/chat/completions", json={"model": "m", "messages": msgs, "tools": CHAT_TOOLS})
        assert resp.status_code == 200, resp.text
        msgs = _next_turn(msgs, resp.json(), turn)
    calls = rig.calls()
    assert [c.seq for c in calls] == list(range(6)) and {c.status for c in calls} == {"ok"}
    assert _extends_exactly(calls) == [True] * 5
    procs = list(rig.proxy._workers.procs)
    rig.proxy.stop()
    assert all(p.poll() is not None for p in procs) and not sock.exists()


@pytest.mark.slow
def test_a_killed_worker_is_replaced_and_every_answered_call_is_recorded(make_rig):
    """kill -9 of one worker: the other keeps serving, every call that was answered is a row (a
    response leaves only after its commit), and a new worker takes the dead one's place."""
    import os
    import signal
    import time

    rig = make_rig(lambda ids: "ok", workers=2)
    workers = rig.proxy._workers
    victim = workers.procs[0]
    answered = 0
    for i in range(12):
        if i == 4:
            os.kill(victim.pid, signal.SIGKILL)
        try:
            with httpx.Client(base_url=rig.url, timeout=60, headers={"authorization": f"Bearer {rig.key}"}) as http:
                resp = http.post("/v1/chat/completions", json={"model": "m", "messages": [
                    {"role": "user", "content": f"call {i}"}]})
        except httpx.TransportError:  # a connection the dying worker had accepted
            continue
        assert resp.status_code == 200, resp.text
        answered += 1
    assert answered >= 10
    deadline = time.monotonic() + 150
    while (workers.restarts < 1 or workers.alive() < 2) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert workers.restarts == 1 and workers.alive() == 2 and victim.pid not in [p.pid for p in workers.procs]
    ok = [c for c in rig.calls() if c.status == "ok"]
    assert len(ok) == answered and [c.seq for c in rig.calls()] == list(range(len(rig.calls())))
