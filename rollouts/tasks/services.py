"""Task services: mock APIs a task declares, started on the host for one rollout, recorded, graded.

    services = [{name = "mail", command = "python server.py", files = {"server.py" = "..."},
                 health = {method = "GET", path = "/health"}, reset = {method = "POST", path = "/reset"},
                 error_rate = 0.25}]

    session = await asyncio.to_thread(ServiceSession.open, task.services, seed="task-id/0")
    session.urls()        # {"mail": "http://127.0.0.1:41234"}: the recording front, reachable from the host
    session.requests()    # every request the front received: method, path, body, status, injected
    session.close()       # after grading: the processes' groups killed, their folder removed

Each service's command runs in a fresh 0700 folder holding its `files`, with `$PORT` the loopback port it
listens on (ClawEval's mock services read `PORT`), confined (sandbox/confine.py): a bubblewrap sandbox of
its own with no network, its folder at /task, an environment of PATH, LANG, HOME, TMPDIR, PORT,
FORGE_SERVICE_DIR and the task's `env` only (the agent drives it: it must reach no more than the agent
does), the host reaching it through a unix socket. In front of it forge serves a *recording
front* (rollouts/tasks/service_front.py) on another ephemeral 127.0.0.1 port and on a unix socket that
`expose` binds into an isolated sandbox, in this process: every request that reaches the service
through the front is recorded here, in memory, by forge. The sandbox has no copy of that record, so
nothing the agent writes (a `dispatches.json` claiming a call) can reach a grader that reads it.

Error injection is the front's, as ClawEval's mock services do it (`mock_services/_base.py`: 429 or 500
on a share of the POST tool calls), but deterministic: request n of service s in the rollout seeded
`seed` gets an error when `Random(f"{seed}/{s}/{n}").random() < error_rate` (`injected_status`), so a
test can say which requests failed. Health and reset probes go straight to the service, unrecorded.

A service that exits, or does not answer its health check within `ready_timeout_s`, raises
`ServiceStartFailed` naming it and the tail of its stderr: the runner makes that an infrastructure
failure, never a reward.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from openforge.errors import TaskError
from openforge.sandbox.gc import owned_tempdir, remove_owned
from openforge.rollouts.tasks.grading import check_relative_paths
from openforge.rollouts.tasks.service_front import (TOOL_HEADER, Backend, RecordingFront, ServiceRequest,
                                                    backend_connection, injected_status)
from openforge.sandbox.confine import Confinement, ConfinementUnavailable
from openforge.ports import free_port

__all__ = ["TOOL_HEADER", "RequestRule", "ServiceRequest", "ServiceSession", "ServiceSpec", "ServiceStartFailed",
           "check_requests", "gates_hold", "injected_status", "services_summary"]

SERVICE_PORT_BASE = 8710  # service i at 127.0.0.1:8710+i inside an isolated sandbox (8700 proxy, 8701 tools)
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")


def check_name(value: str) -> str:
    """A task service's name (or a task MCP server's, mcp_servers.py): it names env variables and folders."""
    if not _NAME_RE.match(value):
        raise ValueError("must be 1-64 of letters, digits, _ - (starting with a letter)")
    return value


class ServiceStartFailed(TaskError):
    """A task service did not start or never became healthy: the rollout's infrastructure failed."""


class Endpoint(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "GET"
    path: str = Field(description="absolute path on the service, e.g. /health")

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/") or any(c.isspace() for c in value):
            raise ValueError(f"path {value!r} must start with / and hold no spaces")
        return value


class ServiceSpec(BaseModel):
    """One service of a task (TaskSpec.services)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="unique within the task: letters, digits, _ -")
    command: str = Field(min_length=1, description="run in the service's folder, in a sandbox of its own beside the "
                                                   "agent's; listens on 127.0.0.1:$PORT")
    files: dict[str, str] = Field(default_factory=dict, description="written into the service's folder first")
    env: dict[str, str] = Field(default_factory=dict, description="added to the command's environment")
    health: Endpoint = Field(description="answered below 500 once the service is ready")
    reset: Endpoint | None = Field(None, description="called once the service is healthy, before the agent starts")
    error_rate: float = Field(0.0, ge=0, le=1, description="share of POST requests answered 429/500 by the front")
    ready_timeout_s: float = Field(10.0, gt=0, le=300, description="how long the health check may take to pass")

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        return check_name(value)

    @field_validator("files")
    @classmethod
    def _check_files(cls, value: dict[str, str]) -> dict[str, str]:
        check_relative_paths(value, "the service's folder")
        return value


class RequestRule(BaseModel):
    """An exact check on the record of a task's services (TaskSpec.expect_requests):

        {service = "mail", method = "POST", path = "/send", body = {to = "bob@x.org"}}          made (status < 400)
        {service = "mail", method = "POST", path = "/delete", absent = true}                     never tried

    `body` fields are compared with `==` on the request's JSON object (top-level keys); `tool` is the
    task tool the MCP server said it carried out. A request answered >= 400 (an injected error included)
    did not happen for a required rule; for an `absent` rule any attempt counts. A `gate` rule that fails
    makes the reward 0 even beside a judge (whose score would otherwise be weighed in)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    service: str
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    path: str | None = Field(None, description="exact path (no query); None: any path")
    tool: str | None = None
    body: dict[str, Any] = Field(default_factory=dict)
    min_count: int = Field(1, ge=1)
    absent: bool = False
    gate: bool = Field(False, description=(
        "when it fails, the whole reward is 0, a judge component's score included (ClawEval's safety checks)"))

    def describe(self) -> str:
        what = f"{self.service} {self.method} {self.path or '*'}" + (f" tool {self.tool}" if self.tool else "")
        if self.body:
            what += " " + json.dumps(self.body, sort_keys=True, ensure_ascii=False)[:200]
        return f"no {what}" if self.absent else f"{what}" + (f" x{self.min_count}" if self.min_count > 1 else "")




def _matches(request: ServiceRequest, rule: RequestRule) -> bool:
    if (request.service, request.method) != (rule.service, rule.method):
        return False
    if rule.path is not None and request.path != rule.path or rule.tool is not None and request.tool != rule.tool:
        return False
    if rule.body:
        body = request.json_body()
        if not isinstance(body, dict) or any(k not in body or body[k] != v for k, v in rule.body.items()):
            return False
    return True


def check_requests(rules: list[RequestRule], record: list[ServiceRequest]) -> tuple[bool, list[str]]:
    """(every rule holds, one line per rule) against a rollout's record."""
    lines, passed = [], True
    for rule in rules:
        hits = [r for r in record if _matches(r, rule)]
        if rule.absent:
            ok = not hits
        else:
            hits = [r for r in hits if r.status < 400]
            ok = len(hits) >= rule.min_count
        passed &= ok
        lines.append(f"request {rule.describe()}: {'ok' if ok else 'wrong'} ({len(hits)} matching)")
    return passed, lines


def gates_hold(rules: list[RequestRule], record: list[ServiceRequest]) -> bool:
    """Whether every `gate` rule holds: one that fails makes the reward 0 whatever else scored."""
    return check_requests([r for r in rules if r.gate], record)[0]


@dataclass
class _Running:
    spec: ServiceSpec
    backend: Backend  # how the host reaches the service: its loopback port, or its confined sandbox's socket
    proc: subprocess.Popen[bytes]
    stderr_path: str
    deadline: float  # time.monotonic() by which the health check must pass
    front: RecordingFront | None = None


def _argv(command: str) -> list[str]:
    argv = shlex.split(command)
    if argv and argv[0] in ("python", "python3"):  # the interpreter forge runs under (as ClawEval does)
        argv[0] = sys.executable
    return argv


def _probe(backend: Backend, endpoint: Endpoint) -> int | None:
    conn = backend_connection(backend, 2.0)
    try:
        body = b"{}" if endpoint.method != "GET" else None
        headers = {"X-Health-Check": "1", "Content-Type": "application/json"}
        conn.request(endpoint.method, endpoint.path, body=body, headers=headers)
        return conn.getresponse().status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


class ServiceSession:
    """One rollout's services: their processes, their recording fronts, the record."""

    def __init__(self, seed: str, confinement: Confinement) -> None:
        self.seed = seed
        self.confinement = confinement
        self.folder = owned_tempdir("forge-services-")  # 0700: ours only; `forge gc` sweeps it after a crash
        self._lock = threading.Lock()
        self._record: list[ServiceRequest] = []
        self._running: list[_Running] = []

    @classmethod
    def open(cls, specs: list[ServiceSpec], *, seed: str, confinement: Confinement | None = None) -> "ServiceSession":
        """Start every service, wait for each to be healthy, reset it, put its front up. On any failure
        everything started is stopped and ServiceStartFailed says which service and why. `confinement`:
        the run's (Confinement.for_sandbox); by default bubblewrap, refused where it is missing."""
        try:
            confinement = confinement or Confinement.required()
        except ConfinementUnavailable as exc:
            raise ServiceStartFailed(f"services cannot run here: {exc}") from None
        session = cls(seed, confinement)
        try:  # every process first, then the health checks: slow starters (FastAPI apps) start together
            for spec in specs:
                session._spawn(spec)
            for running in session._running:
                session._ready(running)
        except BaseException:
            session.close()
            raise
        return session

    def _spawn(self, spec: ServiceSpec) -> None:
        folder = os.path.join(self.folder, spec.name)
        os.makedirs(folder, mode=0o700)
        for path, content in spec.files.items():
            target = os.path.join(folder, path)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "w", encoding="utf-8") as f:
                f.write(content)
        # Confined, the port is on the sandbox's own loopback (any would do); unconfined, on the host's.
        port, confined = free_port(), self.confinement.confined
        env = {**spec.env, "PORT": str(port), "FORGE_SERVICE_DIR": self.confinement.inside(folder)}
        stderr_path = os.path.join(self.folder, f"{spec.name}.stderr")
        try:
            argv, env = self.confinement.command(_argv(spec.command), folder, env=env,
                                                 listen=port if confined else None)
            with open(stderr_path, "wb") as err:
                proc = subprocess.Popen(argv, cwd=folder, env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        except (OSError, ValueError) as exc:
            raise ServiceStartFailed(f"service {spec.name}: cannot run {spec.command!r}: {exc}") from None
        backend: Backend = (Confinement.listen_socket(folder), port) if confined else port
        self._running.append(_Running(spec, backend, proc, stderr_path, time.monotonic() + spec.ready_timeout_s))

    def _ready(self, running: _Running) -> None:
        """Wait for the service's health check, reset it, put its front up."""
        spec, backend, proc = running.spec, running.backend, running.proc
        while True:
            if proc.poll() is not None:
                raise ServiceStartFailed(f"service {spec.name} exited with code {proc.returncode} before it was "
                                         f"healthy: {self._stderr(running)}")
            status = _probe(backend, spec.health)
            if status is not None and status < 500:
                break
            if time.monotonic() > running.deadline:
                raise ServiceStartFailed(
                    f"service {spec.name} did not answer {spec.health.method} {spec.health.path} below 500 within "
                    f"{spec.ready_timeout_s:g}s (last: {status or 'no answer'}): {self._stderr(running)}")
            time.sleep(0.1)
        if spec.reset is not None:
            status = _probe(backend, spec.reset)
            if status is None or status >= 400:
                raise ServiceStartFailed(f"service {spec.name}: reset {spec.reset.method} {spec.reset.path} "
                                         f"answered {status or 'nothing'}")
        try:
            running.front = RecordingFront(spec.name, spec.error_rate, backend, self.seed, self._record, self._lock,
                                           os.path.join(self.folder, f"{spec.name}.sock"))
        except OSError as exc:  # e.g. a TMPDIR so long that the socket's path does not fit
            raise ServiceStartFailed(f"service {spec.name}: cannot serve its recording front: {exc}") from None

    @staticmethod
    def _stderr(running: _Running) -> str:
        try:
            with open(running.stderr_path, "rb") as f:
                tail = f.read()[-400:].decode("utf-8", "replace").strip()
        except OSError:
            tail = ""
        return tail or "(no stderr)"

    def urls(self) -> dict[str, str]:
        """{service name: base URL of its recording front}, reachable from the host only."""
        return {r.spec.name: f"http://127.0.0.1:{r.front.port}" for r in self._running if r.front is not None}

    def expose(self, sandbox: Any) -> dict[str, str]:
        """Each service's front made reachable from the sandbox's next execs (`Sandbox.expose_socket`:
        an isolated sandbox gets the front's socket forwarded to 127.0.0.1:SERVICE_PORT_BASE+i), as
        the environment the agent is given: FORGE_SERVICE_<NAME>_URL (upper case, - as _).
        `sandbox.withdraw_sockets()` takes them away again before the graders run."""
        env = {}
        for i, r in enumerate(x for x in self._running if x.front is not None):
            assert r.front is not None
            url = sandbox.expose_socket(r.front.socket_path, f"http://127.0.0.1:{r.front.port}",
                                        SERVICE_PORT_BASE + i)
            env[f"FORGE_SERVICE_{r.spec.name.upper().replace('-', '_')}_URL"] = url.rstrip("/")
        return env

    def requests(self) -> list[ServiceRequest]:
        """The record so far, in the order the fronts received the requests."""
        with self._lock:
            return list(self._record)

    def audit(self, name: str, path: str, timeout_s: float = 10.0) -> Any:
        """`GET path` of service `name`, asked of the service itself (not through its front: the record
        stays the agent's), its JSON answer; {} when it answers none (ClawEval's audit fetch is best-effort)."""
        backend = next((r.backend for r in self._running if r.spec.name == name), None)
        if backend is None:
            return {}
        conn = backend_connection(backend, timeout_s)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return json.loads(response.read()) if response.status < 400 else {}
        except (OSError, http.client.HTTPException, ValueError):
            return {}
        finally:
            conn.close()

    def close(self) -> None:
        """Stop the fronts, kill each service's process group, remove the folder. Safe to call twice."""
        for running in reversed(self._running):
            if running.front is not None:
                running.front.close()
            try:
                os.killpg(running.proc.pid, signal.SIGTERM)
                running.proc.wait(timeout=5)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(running.proc.pid, signal.SIGKILL)
                running.proc.wait(timeout=5)
        self._running.clear()
        remove_owned(self.folder)


def services_summary(record: list[ServiceRequest], limit: int = 50) -> str:
    """The record as lines for the verifier output (the newest `limit`)."""
    shown = record[-limit:]
    lines = [f"  {r.service} {r.method} {r.path} -> {r.status}{' (injected)' if r.injected else ''}"
             + (f" tool {r.tool}" if r.tool else "") for r in shown]
    head = f"service requests: {len(record)}" + (f" (last {limit})" if len(record) > limit else "")
    return "\n".join([head, *lines])
