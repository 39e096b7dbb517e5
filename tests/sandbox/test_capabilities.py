"""Capabilities are declared on the protocols (sandbox/base.py, rollouts/harnesses/base.py), never probed:
a sandbox backend or a harness registered in its registry runs through the runner with no runner edit.

The new backends here are the real local sandbox with one declared member changed each, registered
in `BACKENDS` under a type of their own; the harnesses are shell lines registered in `HARNESSES`."""

from __future__ import annotations

import ast
import inspect
import socket
from pathlib import Path
from typing import Any

import pytest

from openforge.config import ForgeConfig, HarnessConfig, LocalSandboxConfig
from openforge.errors import SandboxError
from openforge.rollouts.harnesses import HARNESSES, get_harness, harness_available, harness_class, harness_names
from openforge.rollouts.harnesses.base import HarnessBase, HarnessContext, HarnessOutcome, answer_file_outcome
from openforge.rollouts.runner import grader as grader_module
from openforge.rollouts.runner import runner as runner_module
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.runs import plan as plan_module
from openforge.runs import prepare as prepare_module
from openforge.rollouts.tasks.format import TaskSpec, load_tasks
from openforge.rollouts.tasks.web.payload import WebPayload
from openforge.sandbox.base import ExecResult, IsolationReport, Sandbox, SandboxBase, SandboxInfo, proxy_url_via
from openforge.sandbox import gc as gc_module
from openforge.sandbox.factory import BACKENDS, isolation_check, make_sandbox, sandbox_class
from openforge.sandbox.gui import GuiSpec
from openforge.sandbox.local import LocalSandbox
from openforge.store import Store

HOST_PROXY = "http://127.0.0.1:9"
TUNNEL_URL = "http://proxy.tunnel:8700"
THIS_MODULE = __name__


# -- a new backend: the local sandbox reached through a "tunnel", headless, with its own programs ------

class TunnelSandbox(LocalSandbox):
    supports_gui = False
    runs_host_programs = False

    @classmethod
    def check_isolation(cls, config: LocalSandboxConfig) -> IsolationReport:
        return IsolationReport("tunnel", "a test backend")

    @classmethod
    def with_host_folders(cls, config: LocalSandboxConfig, folders: list[str]) -> LocalSandboxConfig:
        return SandboxBase.with_host_folders(config, folders)

    def agent_proxy_url(self, host_url: str) -> str:
        return TUNNEL_URL


class DisplaySandbox(TunnelSandbox):
    """Declares a display and records what the runner attaches (the display itself is not started)."""

    supports_gui = True
    attached: list[GuiSpec | None] = []

    def attach_gui(self, spec: GuiSpec | None) -> None:
        DisplaySandbox.attached.append(spec)


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(BACKENDS, "tunnel", (THIS_MODULE, "TunnelSandbox"))
    monkeypatch.setitem(BACKENDS, "display", (THIS_MODULE, "DisplaySandbox"))
    monkeypatch.setitem(HARNESSES, "probe", (THIS_MODULE, "ProbeHarness"))
    DisplaySandbox.attached = []


def _config(sandbox_type: str = "local", harness: str = "mini", **harness_fields: object) -> ForgeConfig:
    """A config naming a registered backend and harness: the config's own union and Literal list only the
    built-in ones, so the test ones go in by copy (as a user's config would once they are data)."""
    cfg = ForgeConfig()
    sandbox = LocalSandboxConfig(isolation="none").model_copy(update={"type": sandbox_type})
    return cfg.model_copy(update={"sandbox": sandbox,
                                  "harness": cfg.harness.model_copy(update={"name": harness, **harness_fields})})


# -- harnesses ------------------------------------------------------------------------------------------

class EchoHarness(HarnessBase):
    """Answers with the proxy URL it was given; prints FORGE_START_URL (what an own-browser harness gets)."""

    name = "echo"
    calls_model = False

    async def prepare(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
        pass

    def command(self, ctx: HarnessContext) -> list[str]:
        return ["sh", "-c", 'mkdir -p .forge; printf %s "$BASE_URL" > .forge/answer.txt; echo "start=$FORGE_START_URL"']

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {"BASE_URL": ctx.proxy_url}

    async def outcome(self, result: ExecResult, sandbox: Sandbox) -> HarnessOutcome:
        return await answer_file_outcome(result, sandbox, name=self.name)


class OwnBrowserHarness(EchoHarness):
    own_browser = True


class ProbeHarness(EchoHarness):
    """Registered by name only; it calls the model by default (it never does: a harness failure)."""

    name = "probe"
    calls_model = True

    def __init__(self, config: HarnessConfig) -> None:
        self.config = config

    @classmethod
    def available(cls, config: ForgeConfig) -> str | None:
        return f"probe needs its tool in {config.harness.npm_cache or 'the cache'}"


async def _run(store: Store, cfg: ForgeConfig, task: TaskSpec, harness: HarnessBase | None = None) -> object:
    run = store.create_run(kind="eval")
    [ro] = await RolloutRunner(store, config=cfg, proxy_url=HOST_PROXY, harness=harness).run(run.id, [RolloutSpec(task)])
    return ro


def _task(**kw: object) -> TaskSpec:
    return TaskSpec(id="t", instruction="say the URL", **kw)


# -- the runner asks nothing -----------------------------------------------------------------------------

@pytest.mark.parametrize("module", [runner_module, grader_module])
def test_the_runner_never_asks_what_it_has(module: Any) -> None:
    """No hasattr/getattr, and no comparison with a backend's or a harness's name, in the runner or its grader."""
    tree = ast.parse(Path(inspect.getsourcefile(module) or "").read_text())
    names = {*BACKENDS, *harness_names()}
    probes = [n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
              and n.func.id in ("hasattr", "getattr")]
    compared = [c.value for n in ast.walk(tree) if isinstance(n, ast.Compare)
                for c in ast.walk(n) if isinstance(c, ast.Constant) and c.value in names]
    backend_reads = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Compare)
                     for a in ast.walk(n) if isinstance(a, ast.Attribute) and a.attr in ("backend", "type")]
    assert (probes, compared, backend_reads) == ([], [], [])


@pytest.mark.parametrize("module", [prepare_module, plan_module, gc_module])
def test_preflight_plan_and_gc_never_ask_which_backend(module: Any) -> None:
    """Each backend's config says what to check before a run, what a dry run shows and what to sweep
    (openforge/config.py): these modules compare no `sandbox.type` and no backend's name."""
    tree = ast.parse(Path(inspect.getsourcefile(module) or "").read_text())
    compared = [c.value for n in ast.walk(tree) if isinstance(n, ast.Compare)
                for c in ast.walk(n) if isinstance(c, ast.Constant) and c.value in BACKENDS]
    type_reads = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Compare)
                  for a in ast.walk(n) if isinstance(a, ast.Attribute) and a.attr == "type"]
    assert (compared, type_reads) == ([], [])


def test_a_registered_backend_is_built_and_checked_by_its_config(registered: None) -> None:
    """`get_sandbox` builds the class `SANDBOX_BACKENDS` names for the config's type (a test backend here);
    its preflight, plan lines and manifests are its config's."""
    tunnel = _config("tunnel").sandbox
    assert type(tunnel.get_sandbox(run_id="r", rollout_id="ro")) is TunnelSandbox
    assert tunnel.preflight_checks() == [] and tunnel.plan_manifests(proxy_port=8700, gui=False) == []
    assert dict(tunnel.plan_lines())["isolation"] == "none"
    found, notes = tunnel.collect_remote(home=Path("/nonexistent"), run_id=None, is_live=lambda run: False,
                                         live_runs=False, dry_run=True)
    assert (found, notes) == ([], [])


# -- sandboxes -------------------------------------------------------------------------------------------

async def test_the_real_local_sandbox_gives_the_agent_the_proxy_url(store: Store) -> None:
    """The shipped path: make_sandbox picks LocalSandbox from BACKENDS; without the proxy's socket the
    agent gets the host's URL (the sandbox shares the host's network)."""
    ro = await _run(store, _config(), _task(expect_answer={"text": HOST_PROXY}), EchoHarness())
    assert (ro.status, ro.reward, ro.sandbox) == ("scored", 1.0, "local"), ro.error


async def test_an_isolated_local_sandbox_gives_the_agent_its_forwarder(store: Store, tmp_path: Path) -> None:
    """With bubblewrap and the proxy's socket bound in, the agent reaches the proxy at the sandbox's own
    127.0.0.1 (the forwarder's port), whatever the host's URL."""
    from openforge.sandbox.local import PROXY_PORT, bwrap_usable

    if not bwrap_usable():
        pytest.skip("no usable bubblewrap here")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "proxy.sock"))
    cfg = _config().model_copy(update={"sandbox": LocalSandboxConfig()})
    run = store.create_run(kind="eval")
    try:
        [ro] = await RolloutRunner(store, config=cfg, proxy_url=HOST_PROXY, harness=EchoHarness(),
                                   proxy_socket=str(tmp_path / "proxy.sock")).run(
            run.id, [RolloutSpec(_task(expect_answer={"text": f"http://127.0.0.1:{PROXY_PORT}"}))])
    finally:
        listener.close()
    assert (ro.status, ro.reward) == ("scored", 1.0), (ro.error, ro.verifier_output)


async def test_a_registered_backend_runs_with_no_runner_edit(store: Store, registered: None) -> None:
    ro = await _run(store, _config("tunnel"), _task(expect_answer={"text": TUNNEL_URL}), EchoHarness())
    assert (ro.status, ro.reward, ro.sandbox) == ("scored", 1.0, "tunnel"), ro.error
    assert isinstance(make_sandbox(_config("tunnel").sandbox, run_id="r", rollout_id="x"), TunnelSandbox)
    assert isolation_check(_config("tunnel").sandbox) == IsolationReport("tunnel", "a test backend")


async def test_a_gui_task_on_a_backend_without_a_display_is_an_infra_failure(store: Store, registered: None) -> None:
    task = next(t for t in load_tasks("builtin-web") if (web := t.payload(WebPayload)) and web.gui is not None)
    ro = await _run(store, _config("tunnel"), task, EchoHarness())
    assert (ro.status, ro.failure_kind) == ("failed", "infra")
    assert "needs a sandbox with a display: the local backend has none" in ro.error, ro.error


async def test_own_browser_moves_the_page_from_the_display_to_the_harness(store: Store, registered: None) -> None:
    task = next(t for t in load_tasks("builtin-web") if (web := t.payload(WebPayload)) and web.gui is not None)
    plain = await _run(store, _config("display"), task, EchoHarness())
    [shown, detached] = DisplaySandbox.attached
    assert shown is not None and shown.url and detached is None
    assert "start=\n" in plain.stdout  # the display's browser shows the page; the harness is told nothing
    DisplaySandbox.attached = []
    own = await _run(store, _config("display"), task, OwnBrowserHarness())
    [shown_own, _] = DisplaySandbox.attached
    assert shown_own is not None and shown_own.url is None  # no browser of the display's
    assert f"start={shown.url}\n" in own.stdout, own.stdout


def test_with_host_folders_is_the_backends_choice(store: Store, registered: None) -> None:
    """The npm cache is bound only where the backend says it runs host programs."""
    local = RolloutRunner(store, config=_config(npm_cache="/opt/cache"), proxy_url=HOST_PROXY,
                          harness=EchoHarness())
    assert local.sandbox_config.read_only_paths[-1] == "/opt/cache"
    tunnel = RolloutRunner(store, config=_config("tunnel", npm_cache="/opt/cache"), proxy_url=HOST_PROXY,
                           harness=EchoHarness())
    assert tunnel.sandbox_config.read_only_paths == []


def test_unknown_backend_names_the_known_ones() -> None:
    with pytest.raises(SandboxError, match="unknown sandbox.type 'nope'; choose local, docker, kubernetes"):
        sandbox_class("nope")


def test_backends_declare_their_capabilities() -> None:
    """Each shipped backend's declarations, read from the class (importing it needs no SDK)."""
    declared = {t: (sandbox_class(t).supports_gui, sandbox_class(t).runs_host_programs) for t in BACKENDS}
    assert declared == {"local": (True, True), "docker": (True, False), "kubernetes": (True, False)}


def test_default_proxy_url_is_the_host_url_through_the_sandboxs_proxy_host() -> None:
    assert proxy_url_via("http://127.0.0.1:8700", "10.0.0.5") == "http://10.0.0.5:8700"
    assert proxy_url_via("http://localhost/v1", "gateway") == "http://gateway/v1"
    assert proxy_url_via("http://127.0.0.1:8700", "127.0.0.1") == "http://127.0.0.1:8700"
    assert proxy_url_via("http://proxy.example:8700", "10.0.0.5") == "http://proxy.example:8700"

    class Plain(SandboxBase):
        def __init__(self) -> None:
            self.info = SandboxInfo(backend="plain", sandbox_id="p", workdir="/w", proxy_host="10.0.0.5")

    assert Plain().agent_proxy_url("http://127.0.0.1:8700") == "http://10.0.0.5:8700"
    with pytest.raises(SandboxError, match="the plain backend has no display"):
        Plain().attach_gui(GuiSpec())
    Plain().attach_gui(None)  # detaching what was never attached is fine


def test_container_backends_say_how_the_agent_reaches_the_proxy() -> None:
    """Docker: its forwarder once started, else the host's URL; Kubernetes: sandbox.proxy_url, else the
    host's URL (constructed only: neither talks to an engine or a cluster here)."""
    from openforge.config import sandbox_config

    docker = make_sandbox(sandbox_config("docker"), run_id="r", rollout_id="d")
    assert docker.agent_proxy_url(HOST_PROXY) == HOST_PROXY
    docker.proxy_url = "http://127.0.0.1:8701"  # what start() sets once the forwarder listens
    assert docker.agent_proxy_url(HOST_PROXY) == "http://127.0.0.1:8701"
    pods = make_sandbox(sandbox_config("kubernetes", proxy_url="http://forge-proxy.openforge:8700"),
                        run_id="r", rollout_id="k")
    assert pods.agent_proxy_url(HOST_PROXY) == "http://forge-proxy.openforge:8700"
    bare = make_sandbox(sandbox_config("kubernetes"), run_id="r", rollout_id="k2")
    assert bare.agent_proxy_url(HOST_PROXY) == HOST_PROXY


# -- harnesses -------------------------------------------------------------------------------------------

def test_a_registered_harness_is_checked_by_its_own_available(registered: None) -> None:
    assert harness_available(_config(harness="probe", npm_cache="/opt/c")) == "probe needs its tool in /opt/c"
    assert harness_available(_config("tunnel", harness="probe")) is None  # its image's install: prepare checks
    assert harness_available(_config(harness="nope")).startswith("unknown harness 'nope'; known: browser-use, claude-code, codex, mini, ")


async def test_a_registered_harness_runs_by_name_and_calls_model_holds(store: Store, registered: None) -> None:
    cfg = _config(harness="probe")
    assert isinstance(get_harness(cfg.harness), ProbeHarness)
    ro = await _run(store, cfg, _task(expect_answer={"text": HOST_PROXY}))  # the runner builds it from the config
    assert (ro.status, ro.failure_kind, ro.harness) == ("failed", "harness", "probe")
    assert "probe made no successful model call" in ro.error


def test_shipped_harnesses_declare_what_they_need() -> None:
    declared = {n: (harness_class(n).gui, harness_class(n).own_browser, harness_class(n).calls_model)
                for n in harness_names()}
    assert declared == {"mini": (False, False, True), "claude-code": (False, False, True),
                        "codex": (False, False, True), "mini-swe-agent": (False, False, True),
                        "opencode": (False, False, True), "openclaw": (False, False, True),
                        "zeroclaw": (False, False, True), "mini-gui": (True, False, True),
                        "browser-use": (True, True, True)}
