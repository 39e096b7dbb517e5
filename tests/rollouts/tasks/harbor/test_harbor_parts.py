"""The Harbor importer's parts, each on its own: harbor/compose.py (the services beside `main`), harbor/mcp.py
(Harbor's MCP server config and which servers forge can serve from the host), harbor/steps.py (the [[steps]]
of a multi-step task and how their rewards combine)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from openforge.rollouts.tasks.harbor.compose import compose_services
from openforge.rollouts.tasks.harbor.mcp import HarborMcpServer, mcp_server_records
from openforge.rollouts.tasks.harbor.steps import HarborSteps, harbor_steps


def test_compose_services_beside_main_become_records_and_the_rest_reasons(tmp_path: Path) -> None:
    assert compose_services(tmp_path) == ([], [])  # no compose file: no services
    (tmp_path / "docker-compose.yaml").write_text("""
services:
  main: {}
  db:
    image: postgres:16
    environment: [POSTGRES_PASSWORD=x, DEBUG=true]
    command: ["postgres", "-c", "fsync=off"]
  cache:
    image: redis:7
    ports: ["6379:6379"]
  leaky:
    image: busybox
    environment: [HOME]
""")
    records, reasons = compose_services(tmp_path)
    assert records == [{"name": "db", "image": "postgres:16", "environment": {"POSTGRES_PASSWORD": "x", "DEBUG": "true"},
                        "command": ["postgres", "-c", "fsync=off"]}]
    assert any("service cache sets ports" in r for r in reasons)
    assert any("environment HOME takes its value from the host's environment" in r for r in reasons)


def test_mcp_config_is_checked_as_harbor_checks_it() -> None:
    assert HarborMcpServer(name="s", transport="http", url="https://x/mcp").transport == "streamable-http"
    with pytest.raises(ValidationError, match="'url' is required for transport 'sse'"):
        HarborMcpServer(name="s")
    with pytest.raises(ValidationError, match="'command' is required"):
        HarborMcpServer(name="s", transport="stdio")
    with pytest.raises(ValidationError, match="invalid MCP HTTP header name"):
        HarborMcpServer(name="s", url="https://x", headers={"bad header": "v"})


def test_only_stdio_servers_from_copied_files_are_served_from_the_host() -> None:
    servers = [HarborMcpServer(name="files", transport="stdio", command="python3", args=["server.py"]),
               HarborMcpServer(name="inside", url="http://localhost:8000/mcp"),
               HarborMcpServer(name="missing", transport="stdio", command="python3", args=["/opt/absent.py"])]
    records, host_side, reasons = mcp_server_records(servers, {"/app/server.py": "server.py"}, "/app")
    assert records == [{"name": "files", "command": "python3", "args": ["server.py"]}]  # the environment/ file
    assert host_side == {"/app/server.py"}
    assert len(reasons) == 2 and "inside the agent's own container" in reasons[0] and "no COPY brings" in reasons[1]


def test_step_rewards_combine_by_harbors_strategy_and_a_bad_step_is_refused(tmp_path: Path) -> None:
    assert HarborSteps.model_construct(steps=[], reward="mean").combined([1.0, 0.0]) == 0.5
    assert HarborSteps.model_construct(steps=[], reward="final").combined([1.0, 0.0]) == 0.0
    assert HarborSteps.model_construct(steps=[], reward="mean").combined([]) == 0.0
    kw = dict(shared_tests={}, verifier=None, agent_timeout_s=60.0, to_workdir={}, text_tree=lambda p: {})
    assert harbor_steps(tmp_path, [], "best", **kw) == (None, [
        "multi_step_reward_strategy = 'best': Harbor knows 'mean' and 'final'"])
    (tmp_path / "steps" / "one").mkdir(parents=True)
    steps, reasons = harbor_steps(tmp_path, [{"name": "one", "healthcheck": {}}, {"name": "two"}], None, **kw)
    assert steps is None
    assert "step 'one': a step healthcheck is not supported yet" in reasons
    assert "step 'one': steps/one/instruction.md missing" in reasons and "step 'two': no folder steps/two" in reasons
