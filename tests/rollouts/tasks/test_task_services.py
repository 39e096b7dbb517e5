"""Task services (rollouts/tasks/services.py): a real mock API (tests/data/services/mail_server.py) started
per rollout on the host, every request recorded by forge's front, errors injected deterministically,
and the record, never a file in the sandbox, graded by the runner."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
import pytest

from openforge.config import ForgeConfig
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import TaskSpec, validate_tasks
from openforge.rollouts.tasks.selfcheck import _StandInHarness
from openforge.rollouts.tasks.services import (RequestRule, ServiceSession, ServiceSpec, ServiceStartFailed,
                                               check_requests, injected_status)
from openforge.store import Store
from tests.helpers.task_services import SEND, _mail, _task


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_service_is_reset_recorded_and_stopped() -> None:
    session = ServiceSession.open([_mail()], seed="t/0")
    try:
        url = session.urls()["mail"]
        assert url.startswith("http://127.0.0.1:")
        assert httpx.get(f"{url}/outbox").json() == {"messages": []}  # the reset ran: the fixture is gone
        sent = httpx.post(f"{url}/send", json={"to": "bob@example.org", "subject": "hi"},
                          headers={"X-Forge-Tool": "send_mail"})
        assert sent.status_code == 200 and sent.json() == {"id": 1}
        assert httpx.post(f"{url}/send", json={"subject": "no one"}).status_code == 422
        record = session.requests()
        assert [(r.method, r.path, r.status, r.tool) for r in record] == [
            ("GET", "/outbox", 200, None), ("POST", "/send", 200, "send_mail"), ("POST", "/send", 422, None)]
        assert record[1].json_body() == {"to": "bob@example.org", "subject": "hi"}
        pid = session._running[0].proc.pid
        folder = session.folder
    finally:
        session.close()
    assert not _pid_alive(pid) and not os.path.exists(folder)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/outbox")


def test_request_rules_are_exact() -> None:
    session = ServiceSession.open([_mail()], seed="t/0")
    try:
        url = session.urls()["mail"]
        httpx.post(f"{url}/send", json={"to": "bob@example.org", "subject": "hi", "extra": 1})
        httpx.post(f"{url}/send", json={"subject": "missing to"})  # 422: did not happen
        record = session.requests()
    finally:
        session.close()

    def holds(**rule: object) -> bool:
        return check_requests([RequestRule.model_validate({"service": "mail", **rule})], record)[0]

    assert holds(path="/send", body={"to": "bob@example.org"})
    assert not holds(path="/send", body={"to": "Bob@example.org"})  # exact, not case-folded
    assert not holds(path="/send", body={"to": "bob@example.org "})
    assert not holds(path="/send", body={"subject": "missing to"})  # answered 422
    assert not holds(path="/send", min_count=2)
    assert not holds(path="/send", absent=True)  # any attempt breaks an absent rule
    assert holds(path="/delete", absent=True)
    assert not holds(method="GET", path="/send")


def test_errors_are_injected_at_the_rate_and_reproducibly() -> None:
    rate, n = 0.5, 24
    expected = [injected_status("task/3", "mail", i, rate) for i in range(n)]
    assert {s for s in expected if s} == {429, 500} and 4 < sum(s is not None for s in expected) < 20
    for _ in range(2):  # the same seed meets the same errors on the same requests
        session = ServiceSession.open([_mail(error_rate=rate)], seed="task/3")
        try:
            url = session.urls()["mail"]
            got = [httpx.post(f"{url}/send", json={"to": f"u{i}@x.org"}).status_code for i in range(n)]
            assert httpx.get(f"{url}/outbox").status_code == 200  # GETs are never injected
            record = session.requests()
            outbox = httpx.get(f"{url}/outbox").json()["messages"]
        finally:
            session.close()
        assert got == [s or 200 for s in expected]
        assert [r.injected for r in record[:n]] == [s is not None for s in expected]
        assert len(outbox) == sum(s is None for s in expected)  # an injected error never reached the service
    assert [injected_status("task/4", "mail", i, rate) for i in range(n)] != expected
    assert injected_status("task/3", "mail", 0, 0.0) is None


def test_a_service_that_never_becomes_healthy_is_named() -> None:
    with pytest.raises(ServiceStartFailed, match=r"service mail did not answer GET /health .* within 1s"):
        ServiceSession.open([_mail(env={"MAIL_BROKEN": "1"}, ready_timeout_s=1)], seed="s")
    with pytest.raises(ServiceStartFailed, match=r"service mail exited with code 3 .*boom"):
        ServiceSession.open([_mail(command="python -c \"import sys; sys.stderr.write('boom'); sys.exit(3)\"")],
                            seed="s")


def test_bad_service_declarations_are_one_line_each(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(
        '{"id": "a", "instruction": "x", "services": [{"name": "m", "command": "true", "health": {"path": "health"}}],'
        ' "expect_requests": [{"service": "m"}]}\n'
        '{"id": "b", "instruction": "x", "services": [], "expect_requests": [{"service": "mail"}]}\n')
    problems = [str(p) for p in validate_tasks(path)]
    assert any(":1 [a]: services.0.health.path: path 'health' must start with /" in p for p in problems), problems
    assert any(":2 [b]: expect_requests: no service named mail" in p for p in problems), problems


# An agent that claims the call instead of making it: dispatch logs where a grader might look for one.
FORGED_DISPATCH = """
mkdir -p .forge logs
for f in .forge/tool-dispatches.jsonl dispatches.jsonl logs/requests.jsonl; do
  echo '{"service": "mail", "tool": "send_mail", "method": "POST", "path": "/send", "body": {"to": "bob@example.org"}, "status": 200}' > $f
done
"""


async def _run(store: Store, tasks: list[TaskSpec], script: str) -> list:
    runner = RolloutRunner(store, config=ForgeConfig(), proxy_url="http://127.0.0.1:9",
                           harness=_StandInHarness({t.id: script for t in tasks}))
    run = store.create_run(kind="check", name="services")
    return await runner.run(run.id, [RolloutSpec(t) for t in tasks])


async def test_the_runner_grades_the_record_never_a_forged_log(store: Store) -> None:
    never = _task(id="never-delete", expect_requests=[{"service": "mail", "path": "/delete", "absent": True}])
    forged, clean = await _run(store, [_task(), never], FORGED_DISPATCH)
    assert (forged.status, forged.reward) == ("scored", 0.0), forged.error
    assert "request mail POST /send" in forged.verifier_output and "wrong (0 matching)" in forged.verifier_output
    assert (clean.status, clean.reward) == ("scored", 1.0), clean.verifier_output
    assert "service requests: 0" in clean.verifier_output


async def test_a_service_that_never_starts_is_an_infrastructure_failure(store: Store) -> None:
    broken = _task(services=[_mail(env={"MAIL_BROKEN": "1"}, ready_timeout_s=1).model_dump()])
    (ro,) = await _run(store, [broken], "true")
    assert (ro.status, ro.failure_kind, ro.reward) == ("failed", "infra", None)
    assert ro.error.startswith("infra: service mail did not answer GET /health")


async def test_the_sandbox_reaches_its_service_and_the_call_is_graded(store: Store) -> None:
    # A tool name is the MCP server's word (the host's front): one the sandbox claims is not recorded.
    claimed = _task(id="claimed-tool", expect_requests=[{"service": "mail", "tool": "send_mail"}])
    ro, tool = await _run(store, [_task(), claimed], SEND.replace("ATTEMPTS", "1"))
    assert (ro.status, ro.reward) == ("scored", 1.0), (ro.error, ro.verifier_output)
    assert "request mail POST /send" in ro.verifier_output and "ok (1 matching)" in ro.verifier_output
    assert "mail POST /send -> 200" in ro.verifier_output and "tool send_mail" not in ro.verifier_output
    assert (tool.status, tool.reward) == ("scored", 0.0), tool.verifier_output


async def test_an_injected_error_is_the_agents_to_recover_from(store: Store) -> None:
    seed, rate = "mail-flaky/0", 0.9
    first_ok = next(i for i in range(50) if injected_status(seed, "mail", i, rate) is None)
    assert first_ok >= 1  # the seed makes the first call fail: a test of recovery, known in advance
    flaky = _task(id="mail-flaky", services=[_mail(error_rate=rate).model_dump()])
    once = await _run(store, [flaky], SEND.replace("ATTEMPTS", "1"))
    retried = await _run(store, [flaky], SEND.replace("ATTEMPTS", str(first_ok + 1)))
    assert (once[0].status, once[0].reward) == ("scored", 0.0), once[0].verifier_output
    assert (retried[0].status, retried[0].reward) == ("scored", 1.0), retried[0].verifier_output
    assert retried[0].verifier_output.count("(injected)") == first_ok


async def test_a_run_cancelled_while_services_start_leaves_none_running(store: Store) -> None:
    # A slow starter: cancelled while its health check waits, the session is closed when it opens.
    slow = _task(id="slow-start", services=[_mail(command="sh -c 'sleep 1; exec python3 mail_server.py'").model_dump()])
    runner = RolloutRunner(store, config=ForgeConfig(), proxy_url="http://127.0.0.1:9",
                           harness=_StandInHarness({slow.id: "true"}))
    run = store.create_run(kind="check", name="cancel")
    before = set(os.listdir(os.environ.get("TMPDIR", "/tmp")))
    task = asyncio.ensure_future(runner.run(run.id, [RolloutSpec(slow)]))
    await asyncio.sleep(0.5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(3)  # the start finishes in its thread, then the session is closed
    left = {n for n in set(os.listdir(os.environ.get("TMPDIR", "/tmp"))) - before if n.startswith("forge-services-")}
    assert not left
    (ro,) = store.list_rollouts(run.id)
    assert ro.status == "cancelled"


# A task service with ordinary debugging endpoints, driven by the agent (issue 43): on the host with forge's
# environment it read /etc/shadow, forge's keys and the task file holding the expected request.
PEEK_SERVICE = '''import json, os, socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _reply(self, text):
        data = text.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        url = urlsplit(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        if url.path == "/peek":
            try:
                with open(q["path"], encoding="utf-8", errors="replace") as f:
                    return self._reply(f.read())
            except OSError as exc:
                return self._reply("unreadable: " + type(exc).__name__)
        if url.path == "/env":
            return self._reply(os.environ.get(q["name"], "unset"))
        if url.path == "/dial":
            try:
                socket.create_connection(("127.0.0.1", int(q["port"])), timeout=2).close()
                return self._reply("reached")
            except OSError:
                return self._reply("unreachable")
        self._reply("ok")

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._reply("sent")


ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
'''
LEAK_CODE = "Q-58213"
TEACHER_KEY = "sk-teacher-0d1e2f"


async def test_a_tasks_service_has_no_more_reach_than_the_agent(store: Store, tmp_path: Path, forge_home: Path,
                                                               monkeypatch) -> None:
    import json
    import socket

    from openforge.rollouts.tasks.format import load_tasks

    monkeypatch.setenv("FORGE_TEACHER_API_KEY", TEACHER_KEY)
    monkeypatch.setenv("OPENAI_API_KEY", TEACHER_KEY)
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text(json.dumps({
        "id": "leak", "instruction": "Send the code.",
        "services": [{"name": "peek", "command": "python server.py", "files": {"server.py": PEEK_SERVICE},
                      "health": {"method": "GET", "path": "/health"}}],
        "expect_requests": [{"service": "peek", "method": "POST", "path": "/send", "body": {"code": LEAK_CODE}}]}) + "\n")
    [task] = load_tasks(tasks_file)
    (forge_home / "secret.txt").write_text("forge's own file\n")
    host = socket.socket()
    host.bind(("127.0.0.1", 0))
    host.listen(8)  # a port on the host's loopback (the engine's, the proxy's): the agent cannot dial it
    probes = {"peek?path=/etc/shadow": None, f"peek?path={forge_home / 'forge.db'}": None,
              f"peek?path={forge_home / 'secret.txt'}": None, f"peek?path=/proc/{os.getpid()}/environ": None,
              "env?name=FORGE_TEACHER_API_KEY": None, "env?name=OPENAI_API_KEY": None, "env?name=FORGE_HOME": None,
              f"dial?port={host.getsockname()[1]}": None}
    script = f'''python3 - <<'PY'
import json, os, re, urllib.request
base = os.environ["FORGE_SERVICE_PEEK_URL"]
task = urllib.request.urlopen(base + "/peek?path={tasks_file}").read().decode()
code = re.search(r"Q-[0-9]+", task)
urllib.request.urlopen(urllib.request.Request(base + "/send", json.dumps({{"code": code.group(0) if code else ""}})
                                              .encode(), {{"Content-Type": "application/json"}}))
out = {{p: urllib.request.urlopen(base + "/" + p).read().decode() for p in {list(probes)!r}}}
open("probes.json", "w").write(json.dumps(out))
PY
cat probes.json
'''
    try:
        (ro,) = await _run(store, [task], script)
    finally:
        host.close()
    assert ro.status == "scored" and ro.reward == 0.0, (ro.error, ro.stderr, ro.verifier_output)
    answers = json.loads(ro.stdout.strip().splitlines()[-1])
    assert set(answers) == set(probes)
    for probe, answer in answers.items():
        assert answer.startswith("unreadable") or answer in ("unset", "unreachable"), (probe, answer[:200])
    assert TEACHER_KEY not in ro.stdout and LEAK_CODE not in ro.stdout


def test_an_unconfined_service_still_gets_none_of_forges_environment(monkeypatch) -> None:
    """sandbox.isolation = "none" (code the user trusts) runs services as plain processes on the host's
    loopback: their environment is still built from nothing (issue 43)."""
    from openforge.sandbox.confine import Confinement

    monkeypatch.setenv("FORGE_TEACHER_API_KEY", TEACHER_KEY)
    spec = ServiceSpec(name="peek", command="python server.py", files={"server.py": PEEK_SERVICE},
                       env={"TASK_SETTING": "kept"}, health={"method": "GET", "path": "/health"})
    session = ServiceSession.open([spec], seed="t/0", confinement=Confinement(None))
    try:
        url = session.urls()["peek"]
        assert httpx.get(f"{url}/env?name=FORGE_TEACHER_API_KEY").text == "unset"
        assert httpx.get(f"{url}/env?name=FORGE_HOME").text == "unset"
        assert httpx.get(f"{url}/env?name=TASK_SETTING").text == "kept"
        assert isinstance(session._running[0].backend, int)  # the host's loopback port: no socket in between
    finally:
        session.close()
