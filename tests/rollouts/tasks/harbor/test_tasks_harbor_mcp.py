"""Harbor's `[[environment.mcp_servers]]` and `environment/docker-compose.yaml` (rollouts/tasks/harbor/mcp.py):
a stdio MCP server runs on the host beside the rollout, its tool reaches the agent through the rollout's own
tool server and every call is in the host's record; a test.sh that needs the tool's answer scores 1 only when
the agent called it. What forge cannot run (servers over HTTP, a compose service it cannot build, a bad
compose file, an unknown transport) is refused with one line by `forge tasks validate` and `forge tasks import harbor`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from typer.testing import CliRunner

from openforge.config import ForgeConfig
from openforge.forge_cli.main import app
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.runner.tool_server import ToolServer, dispatch_record_path
from openforge.rollouts.tasks.format import load_tasks, validate_tasks
from openforge.rollouts.tasks.mcp_servers import McpServerSpec
from openforge.rollouts.tasks.selfcheck import _StandInHarness
from openforge.rollouts.tasks.services import ServiceSession, ServiceSpec
from openforge.sandbox.testing import proxy_socket_path
from openforge.store import Store
from tests.helpers.proxy_rig import make_rig  # noqa: F401 - fixture
from tests.helpers.task_tools import _rollout, call
from tests.helpers.harbor import _task

CODE = "K7-4431"  # only the MCP server knows it: not in the agent's files, in its instruction, or its image
SERVER = f'''from mcp.server.mcpserver import MCPServer

mcp = MCPServer("codes")


@mcp.tool()
def get_code(team: str) -> str:
    """The release code of a team."""
    return {{"blue": "{CODE}"}}.get(team, "no such team")


if __name__ == "__main__":
    mcp.run()
'''
# A stand-in agent without a model: a stdlib MCP client over streamable HTTP (JSON responses), given the
# rollout's tool server as every harness is (FORGE_MCP_URL / FORGE_MCP_TOKEN); argv: tool name, JSON arguments.
CLIENT = '''import json, os, sys, urllib.request
session = {}
def post(method, params=None, id=None):
    body = {"jsonrpc": "2.0", "method": method, **({"params": params} if params is not None else {}),
            **({"id": id} if id is not None else {})}
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "Authorization": "Bearer " + os.environ["FORGE_MCP_TOKEN"], **session}
    request = urllib.request.Request(os.environ["FORGE_MCP_URL"], json.dumps(body).encode(), headers)
    with urllib.request.urlopen(request) as r:
        if r.headers.get("Mcp-Session-Id"):
            session["Mcp-Session-Id"] = r.headers["Mcp-Session-Id"]
        data = r.read()
        return json.loads(data) if data.strip() else None
init = post("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                           "clientInfo": {"name": "stand-in", "version": "0"}}, id=1)
session["MCP-Protocol-Version"] = init["result"]["protocolVersion"]
post("notifications/initialized")
result = post("tools/call", {"name": sys.argv[1], "arguments": json.loads(sys.argv[2])}, id=2)["result"]
print(result["content"][0]["text"])
'''
MCP_TOML = '''[agent]
timeout_sec = 120.0
[[environment.mcp_servers]]
name = "codes"
transport = "stdio"
command = "python3"
args = ["/opt/mcp/server.py"]
'''
TEST_SH = (f'test "$(cat /app/answer.txt)" = "{CODE}" && echo 1 > /logs/verifier/reward.txt '
           '|| echo 0 > /logs/verifier/reward.txt\n')


def _mcp_task(root: Path, name: str = "codes", toml: str = MCP_TOML) -> Path:
    """A Harbor task whose stdio MCP server the Dockerfile COPYs outside the WORKDIR, as such tasks do."""
    folder = _task(root, name, toml=toml, test_sh=TEST_SH,
                   dockerfile="FROM python:3.12-slim\nWORKDIR /app\nCOPY mcp/server.py /opt/mcp/server.py\n",
                   instruction="Ask the codes MCP server for team blue's release code; write it to /app/answer.txt.")
    (folder / "environment" / "mcp").mkdir()
    (folder / "environment" / "mcp" / "server.py").write_text(SERVER)
    return folder


def _calls(tool: str, arguments: dict[str, str]) -> str:
    return f"python3 - {tool} '{json.dumps(arguments)}' > answer.txt <<'PY'\n{CLIENT}PY\n"


def test_a_stdio_mcp_server_becomes_the_tasks_server_run_from_its_environment_files(tmp_path: Path) -> None:
    [task] = load_tasks(_mcp_task(tmp_path))
    [server] = task.mcp_servers
    # /opt/mcp/server.py is read back through the COPY line to environment/mcp/server.py, run on the host
    assert (server.name, server.transport, server.command, server.args) == ("codes", "stdio", "python3",
                                                                            ["mcp/server.py"])
    assert server.files["mcp/server.py"] == SERVER
    assert task.files == {} and CODE not in task.instruction  # the agent gets neither the server nor its answer


def test_a_server_copied_after_a_relative_workdir_is_found_and_kept_from_the_agent(tmp_path: Path) -> None:
    """WORKDIR srv (from /app) then COPY into tools/: the server is /app/srv/tools/server.py, named relative
    to the WORKDIR. Following the WORKDIR twice read it as /app/srv/srv/...: the server was not found and its
    file, with the code, went to the agent."""
    toml = MCP_TOML.replace('args = ["/opt/mcp/server.py"]', 'args = ["tools/server.py"]')
    folder = _task(tmp_path / "set", "rel", toml=toml, test_sh=TEST_SH, instruction="x",
                   dockerfile="FROM python:3.12-slim\nWORKDIR srv\nCOPY mcp/server.py tools/server.py\n")
    (folder / "environment" / "mcp").mkdir()
    (folder / "environment" / "mcp" / "server.py").write_text(SERVER)
    [task] = load_tasks(tmp_path / "set")
    assert task.mcp_servers[0].args == ["mcp/server.py"] and task.files == {}



def test_one_import_reads_a_tasks_mcp_servers_once_and_steps_keep_their_workdir(tmp_path: Path, monkeypatch) -> None:
    """`forge tasks import harbor` decides whether to build and makes the record from one reading of the
    task's servers (it read them twice); each step's WORKDIR is traced from the one the build starts in."""
    import openforge.rollouts.tasks.harbor.folder as harbor
    from openforge.rollouts.tasks.harbor.dockerfile import final_workdir, traced_steps
    from openforge.rollouts.tasks.harbor.image import import_harbor

    steps = traced_steps("FROM x\nCOPY a a\nWORKDIR srv\nCOPY b b\nWORKDIR /abs\nWORKDIR rel\n", "/app")
    assert [s.workdir for s in steps] == ["/app", "/app", "/app/srv", "/app/srv", "/abs", "/abs/rel"]
    assert final_workdir(steps, "/app") == "/abs/rel" and final_workdir([], "/w") == "/w"
    calls = []
    real = harbor.task_mcp_servers
    monkeypatch.setattr(harbor, "task_mcp_servers", lambda *a: calls.append(a) or real(*a))
    report = import_harbor(_mcp_task(tmp_path))  # a Dockerfile that builds nothing: no engine needed
    assert [t["id"] for t in report.tasks] == ["codes"] and report.built == [] and len(calls) == 1

async def test_the_tests_pass_only_when_the_agent_called_the_mcp_servers_tool(store: Store, tmp_path: Path) -> None:
    [task] = load_tasks(_mcp_task(tmp_path))
    scripts = {"calls": _calls("get_code", {"team": "blue"}),
               "guesses": "echo K7-0000 > answer.txt",
               "wrong-team": _calls("get_code", {"team": "red"}),
               # a record the agent writes where the grader's copy goes is moved aside, never read
               "forges": f"mkdir -p .forge && echo '{{\"tool\": \"get_code\"}}' > .forge/tool-dispatches.jsonl"}
    tasks = {label: task.model_copy(update={"id": label}) for label in scripts}  # one rollout each, at once
    run = store.create_run(kind="check")
    runner = RolloutRunner(store, config=ForgeConfig(), proxy_url="http://127.0.0.1:9",
                           harness=_StandInHarness(scripts))
    for ro in await runner.run(run.id, [RolloutSpec(t) for t in tasks.values()]):
        label = ro.task_id
        assert (ro.status, ro.reward) == ("scored", 1.0 if label == "calls" else 0.0), (label, ro.error,
                                                                                          ro.stderr, ro.verifier_output)
        record = [json.loads(x) for x in dispatch_record_path(ro.run_id, ro.id).read_text().splitlines()]
        if label in ("calls", "wrong-team"):
            [dispatch] = record
            assert (dispatch["server"], dispatch["tool"], dispatch["is_error"]) == ("codes", "get_code", False)
            assert dispatch["result"] == (CODE if label == "calls" else "no such team")
        else:
            assert record == []


async def test_an_mcp_server_that_cannot_start_masks_the_rollout(store: Store, tmp_path: Path) -> None:
    [task] = load_tasks(_mcp_task(tmp_path))
    broken = task.model_copy(update={"mcp_servers": [task.mcp_servers[0].model_copy(
        update={"files": {"mcp/server.py": "raise SystemExit('no such module: the server crashed')\n"}})]})
    run = store.create_run(kind="check")
    runner = RolloutRunner(store, config=ForgeConfig(), proxy_url="http://127.0.0.1:9",
                           harness=_StandInHarness({task.id: _calls("get_code", {"team": "blue"})}))
    [ro] = await runner.run(run.id, [RolloutSpec(broken)])
    assert (ro.status, ro.reward) == ("failed", None), (ro.error, ro.verifier_output)
    assert "MCP server codes" in (ro.error or "") and "the server crashed" in (ro.error or "")


async def test_an_agent_that_crashes_the_mcp_server_is_scored_not_masked(store: Store, tmp_path: Path) -> None:
    """The server listed its tools, then died on the agent's call: that is the tool's answer to the call.
    Masking it would let a policy turn any failing rollout into one that teaches nothing: crash a tool."""
    [task] = load_tasks(_mcp_task(tmp_path))
    server = task.mcp_servers[0]
    dies = SERVER.replace('    return {', '    if team == "crash":\n        import os\n        os._exit(1)\n    return {')
    fragile = task.model_copy(update={"mcp_servers": [server.model_copy(update={"files": {"mcp/server.py": dies}})]})
    run = store.create_run(kind="check")
    runner = RolloutRunner(store, config=ForgeConfig(), proxy_url="http://127.0.0.1:9",
                           harness=_StandInHarness({task.id: _calls("get_code", {"team": "crash"})}))
    [ro] = await runner.run(run.id, [RolloutSpec(fragile)])
    assert (ro.status, ro.reward) == ("scored", 0.0), (ro.error, ro.stderr, ro.verifier_output)
    [dispatch] = [json.loads(x) for x in dispatch_record_path(ro.run_id, ro.id).read_text().splitlines()]
    assert dispatch["is_error"] and dispatch["infra_error"] is None
    assert dispatch["failure"].startswith("MCP server codes: tool get_code failed")


async def test_an_mcp_server_over_http_is_reached_through_its_services_recording_front(tmp_path: Path) -> None:
    """The forge format's HTTP route: the server is a task service, so its requests are in the services'
    record as well as the tool server's."""
    app_py = SERVER.replace('mcp.run()', 'import os\n    mcp.run("streamable-http", port=int(os.environ["PORT"]), '
                                         'json_response=True)')
    service = ServiceSpec(name="codes-api", command="python server.py", files={"server.py": app_py},
                          health={"method": "GET", "path": "/health"}, ready_timeout_s=60)
    spec = McpServerSpec(name="codes", transport="streamable-http", service="codes-api", path="/mcp")
    session = ServiceSession.open([service], seed="t/0")
    try:
        async with ToolServer([], record=tmp_path / "r.jsonl", services=session.urls(), mcp_servers=[spec]) as tools:
            assert await tools.dispatch("get_code", {"team": "blue"}) == (CODE, False)
        paths = {(r.method, r.path) for r in session.requests()}
        assert ("POST", "/mcp") in paths
        assert any('"tools/call"' in r.body and r.status == 200 for r in session.requests())
    finally:
        session.close()


def test_what_forge_cannot_run_is_one_line_from_validate_and_import(tmp_path: Path, forge_home: Path) -> None:
    root = tmp_path / "set"
    _mcp_task(root, "fine")
    _mcp_task(root, "websocket", toml=MCP_TOML.replace('"stdio"', '"websocket"'))
    _mcp_task(root, "over-http", toml='[[environment.mcp_servers]]\nname = "db"\nurl = "http://db:8000/sse"\n')
    _mcp_task(root, "in-main", toml='[[environment.mcp_servers]]\nname = "f"\ntransport = "http"\n'
                                    'url = "http://127.0.0.1:3847/mcp"\n')
    _mcp_task(root, "not-copied", toml=MCP_TOML.replace("/opt/mcp/server.py", "/srv/other.py"))
    bad = _mcp_task(root, "bad-compose")
    (bad / "environment" / "docker-compose.yaml").write_text("services:\n  api:\n    image: [oops\n")
    sidecar = _mcp_task(root, "sidecar")
    (sidecar / "environment" / "docker-compose.yaml").write_text("services:\n  api:\n    build: ./api\n"
                                                                 "  main:\n    network_mode: host\n")
    problems: dict[str, str] = {}
    for problem in validate_tasks(root):  # one problem a reason
        problems[problem.task_id] = " | ".join(filter(None, [problems.get(problem.task_id), problem.message]))
    assert problems.keys() == {"websocket", "over-http", "in-main", "not-copied", "bad-compose", "sidecar"}
    assert problems["websocket"] == ("task.toml: environment.mcp_servers.0.transport: Input should be 'stdio', "
                                     "'sse' or 'streamable-http'")
    assert "sse at http://db:8000/sse" in problems["over-http"] and "compose" in problems["over-http"]
    assert "inside the agent's own container" in problems["in-main"]
    assert "/srv/other.py is a path in the image that no COPY brings" in problems["not-copied"]
    assert problems["bad-compose"].startswith("environment/docker-compose.yaml: not valid YAML (line 4)")
    assert "service api: build './api': no Dockerfile in that folder of environment/" in problems["sidecar"]
    assert "service main sets network_mode" in problems["sidecar"]
    assert all("\n" not in m for m in problems.values())  # each reason one line

    cli = CliRunner()
    validated = cli.invoke(app, ["tasks", "validate", str(root)])
    assert validated.exit_code != 0 and "Traceback" not in validated.output
    assert "[websocket]: task.toml: environment.mcp_servers.0.transport" in validated.output
    imported = cli.invoke(app, ["tasks", "import", "harbor", str(root), "--out", str(tmp_path / "out")])
    assert imported.exit_code == 0, imported.output
    assert "7 task(s): 1 imported" in imported.output and "6 refused" in imported.output
    assert "bad-compose: environment/docker-compose.yaml: not valid YAML" in imported.output
    [written] = load_tasks(tmp_path / "out")  # the imported record keeps its server and runs as read here
    assert written.mcp_servers[0].args == ["mcp/server.py"]


async def test_mini_calls_the_harbor_servers_tool_as_a_native_function_tool(make_rig, tmp_path: Path) -> None:  # noqa: F811
    """The real harness path: mini lists the rollout's tool server (the stdio server's tool among them), the
    scripted model calls it, writes its answer with bash, and the task's test.sh scores it."""
    [task] = load_tasks(_mcp_task(tmp_path))
    rig = make_rig([], uds=Path(proxy_socket_path()))
    write = call("bash", {"command": f"echo {CODE} > answer.txt && echo WROTE"})

    def script(ids: list[int]) -> str:
        seen = rig.engine.tokenizer.decode(ids)
        return "done" if "WROTE" in seen else write if CODE in seen else call("get_code", {"team": "blue"})

    rig.engine.script = script
    ro = await _rollout(rig, task, name="mini", max_turns=5)
    assert (ro.status, ro.reward) == ("scored", 1.0), (ro.error, ro.stderr[-2000:], ro.verifier_output)
    first = rig.store.list_calls(rollout_id=ro.id)[0].request_json
    assert "get_code" in [t["function"]["name"] for t in first["tools"]]
    [dispatch] = [json.loads(x) for x in dispatch_record_path(ro.run_id, ro.id).read_text().splitlines()]
    assert (dispatch["server"], dispatch["arguments"], dispatch["result"]) == ("codes", {"team": "blue"}, CODE)


# A task MCP server with an ordinary file-reading tool (and one that reads its environment): the agent
# points them at the host. Issue 43: on the host as forge's user with forge's environment, it read
# /etc/shadow, the store, forge's own environment, and the task's test.sh with the expected answer (1.0).
PEEK_SERVER = SERVER.replace('if __name__', '''@mcp.tool()
def cat_file(path: str) -> str:
    """A file's text."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError as exc:
        return f"unreadable: {type(exc).__name__}"


@mcp.tool()
def getenv(name: str) -> str:
    """An environment variable."""
    import os
    return os.environ.get(name, "unset")


if __name__''')
TEACHER_KEY = "sk-teacher-0d1e2f"  # a key in forge's environment the task's code must never see


async def test_a_tasks_mcp_server_has_no_more_reach_than_the_agent(store: Store, tmp_path: Path, forge_home: Path,
                                                                   monkeypatch) -> None:
    monkeypatch.setenv("FORGE_TEACHER_API_KEY", TEACHER_KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", TEACHER_KEY)
    folder = _mcp_task(tmp_path)
    (folder / "environment" / "mcp" / "server.py").write_text(PEEK_SERVER)
    [task] = load_tasks(folder)
    test_sh = folder / "tests" / "test.sh"
    assert CODE in test_sh.read_text()
    own = forge_home / "secret.txt"
    own.write_text("forge's own file\n")
    # The whole attack: read the expected answer out of the task's own test.sh, write it as the answer.
    steal = _calls("cat_file", {"path": str(test_sh)}).replace("> answer.txt", "> t.sh") + \
        "grep -o 'K7-[0-9]*' t.sh | head -1 > answer.txt\n"
    probes = [("cat_file", {"path": "/etc/shadow"}), ("cat_file", {"path": str(forge_home / "forge.db")}),
              ("cat_file", {"path": str(own)}), ("cat_file", {"path": f"/proc/{os.getpid()}/environ"}),
              ("cat_file", {"path": f"/proc/{os.getpid()}/cmdline"}),
              ("getenv", {"name": "FORGE_TEACHER_API_KEY"}), ("getenv", {"name": "ANTHROPIC_API_KEY"}),
              ("getenv", {"name": "FORGE_HOME"})]
    script = steal + "".join(_calls(tool, args).replace("> answer.txt", ">> probes.txt") for tool, args in probes)
    run = store.create_run(kind="check")
    runner = RolloutRunner(store, config=ForgeConfig(), proxy_url="http://127.0.0.1:9",
                           harness=_StandInHarness({task.id: script}))
    [ro] = await runner.run(run.id, [RolloutSpec(task)])
    assert (ro.status, ro.reward) == ("scored", 0.0), (ro.error, ro.stderr, ro.verifier_output)
    record = [json.loads(x) for x in dispatch_record_path(ro.run_id, ro.id).read_text().splitlines()]
    assert len(record) == 1 + len(probes) and all(d["infra_error"] is None for d in record), record
    results = {json.dumps(d["arguments"]): d["result"] for d in record}
    for (tool, args) in [("cat_file", {"path": str(test_sh)}), *probes]:
        result = results[json.dumps(args)]
        assert result.startswith("unreadable") or result == "unset", (tool, args, result[:200])
    leaked = "\n".join(results.values())
    assert CODE not in leaked and TEACHER_KEY not in leaked and "root:" not in leaked, leaked[:500]
