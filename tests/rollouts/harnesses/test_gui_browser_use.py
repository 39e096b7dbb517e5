"""browser-use (the real PyPI package, pinned, in its harness venv) driving a real Chromium against a
scripted model that answers with valid browser-use actions; its outcome rules; and a rollout of it in a
real local sandbox through the real proxy.

The venv is the one `forge harness install browser-use` makes, in $FORGE_NPM_CACHE or
~/.cache/openforge-npm (where .ci/run installs it); these tests skip, saying so, without it (and fail
under FORGE_REQUIRE=browser-use, as in CI: tests/helpers/required.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from openforge.rollouts.harnesses.browseruse import browser_use_outcome, find_chromium, venv_python
from openforge.sandbox.base import ExecResult
from tests.helpers.gui_fixtures import (ScriptedModel, Site, browser_use_button_policy, browser_use_reply, run_browser_use,
                          screenshot_of)
from tests.helpers.required import requires

CACHE = Path(os.environ.get("FORGE_NPM_CACHE") or Path.home() / ".cache" / "openforge-npm").expanduser()
PYTHON = venv_python(CACHE)
needs_browser_use = requires(
    "browser-use",
    None if PYTHON is not None and find_chromium() is not None else
    f"browser-use is not installed in {CACHE} (forge harness install browser-use --cache {CACHE})"
    if PYTHON is None else "no chromium (apt-get install chromium)")


def _rec(**kw: Any) -> str:
    base = {"is_done": False, "is_successful": None, "final_result": None, "errors": [], "steps": 3, "api_errors": []}
    return json.dumps({**base, **kw})


def test_outcome_rules() -> None:
    ok = ExecResult(0, "", "")
    done = browser_use_outcome(ok, _rec(is_done=True, is_successful=True, final_result="42"))
    assert (done.answer, done.failure, done.turns) == ("42", None, 3)
    # The agent's own "success: false" is its opinion: the answer is graded all the same.
    assert browser_use_outcome(ok, _rec(is_done=True, is_successful=False, final_result="no")).answer == "no"
    assert browser_use_outcome(ok, _rec(is_done=True, final_result=None)).answer == ""
    assert browser_use_outcome(ok, _rec(errors=["Browser did not start"], answered=0)).failure == \
        "browser-use got no model reply: Browser did not start"  # nothing reached the policy
    limit = browser_use_outcome(ok, _rec(errors=["Invalid JSON"], answered=2))  # the policy's garbage until the limit
    assert limit.answer == "" and limit.failure is None
    api = browser_use_outcome(ok, _rec(api_errors=["API error 400: prompt is too long"]))
    assert api.answer is None and api.failure == "browser-use: API error 400: prompt is too long"
    assert browser_use_outcome(ExecResult(5, "", "boom"), json.dumps({"error": "BrowserStartError: x"})).failure \
        == "browser-use failed: BrowserStartError: x"
    assert browser_use_outcome(ExecResult(137, "", "Killed"), None).failure.startswith("browser-use exited 137")
    assert browser_use_outcome(ExecResult(1, "", ""), _rec(is_done=True, final_result="42")).failure is not None


@pytest.mark.slow
@needs_browser_use
def test_browser_use_clicks_a_real_page(tmp_path: Path) -> None:
    site = Site()
    model = ScriptedModel(browser_use_button_policy)
    try:
        proc, record = run_browser_use(str(PYTHON), tmp_path, model.base_url,
                                       f"Open {site.url} and press the red button.", "--max-steps", "4")
    finally:
        model.close()
        site.close()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert record["is_done"] is True and record["final_result"] == "clicked" and record["api_errors"] == []
    assert site.clicks == 1  # the site's own state: browser-use really pressed the button
    assert len(model.requests) == 2  # click, then done: no judge call, nothing else
    first = model.requests[0]
    assert model.auth[0] == "Bearer sk-rollout-test" and first["model"] == "forge-policy"
    assert first["response_format"]["type"] == "json_schema" and "tools" not in first
    assert screenshot_of(first).format == "PNG"  # one screenshot a call, as a data URL
    assert browser_use_outcome(ExecResult(proc.returncode, proc.stdout, proc.stderr), json.dumps(record)).answer == "clicked"


@pytest.mark.slow
@needs_browser_use
def test_browser_use_api_error_is_a_harness_failure(tmp_path: Path) -> None:
    model = ScriptedModel(lambda body: (400, "prompt is too long"))
    try:
        proc, record = run_browser_use(str(PYTHON), tmp_path, model.base_url, "Open http://127.0.0.1:9/ and look.",
                                       "--max-steps", "3")
    finally:
        model.close()
    outcome = browser_use_outcome(ExecResult(proc.returncode, proc.stdout, proc.stderr), json.dumps(record))
    assert model.requests, ("browser-use never called the model", record, proc.stderr[-2000:])
    assert outcome.answer is None and "API error 400" in outcome.failure, (record, proc.stderr[-2000:])


@pytest.mark.slow
@needs_browser_use
def test_browser_use_garbage_is_graded_not_failed(tmp_path: Path) -> None:
    """A policy that never writes a valid action: browser-use reports it back as a step error, then
    stops; that is the policy's data (an empty answer), not a harness failure."""
    model = ScriptedModel(lambda body: {"role": "assistant", "content": "not json"})
    try:
        proc, record = run_browser_use(str(PYTHON), tmp_path, model.base_url, "Do nothing.", "--max-steps", "2")
    finally:
        model.close()
    outcome = browser_use_outcome(ExecResult(proc.returncode, proc.stdout, proc.stderr), json.dumps(record))
    assert record["is_done"] is False and record["errors"] and record["answered"] >= 1, (record, proc.stderr[-2000:])
    assert outcome.answer == "" and outcome.failure is None


@pytest.mark.slow
@needs_browser_use
def test_browser_use_in_a_gui_sandbox_through_the_proxy(tiny_vl_model: Path, store: Any, forge_home: Path,
                                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """browser-use in a bubblewrap sandbox with its own display (it starts its own chromium there), the
    site's state on the host behind a unix socket, its calls through the real proxy (screenshots and
    all) to a scripted engine on the tiny Qwen2-VL that reads browser-use's element list from the prompt
    and answers valid browser-use actions: click the button, then done. The outcome comes from
    browser-use's own history; the site's state shows the click."""
    import asyncio
    import re

    from openforge.engine.scripted import ScriptedEngine
    from openforge.engine.serve import serve_in_thread
    from tests.helpers.gui_fixtures import Site
    from openforge.config import HarnessConfig, LocalSandboxConfig, ProxyConfig
    from openforge.proxy.server import ProxyServer
    from openforge.rollouts.harnesses.base import HarnessContext
    from openforge.rollouts.harnesses import get_harness
    from openforge.sandbox.gui import GuiSpec
    from openforge.sandbox.local import LocalSandbox, bwrap_usable
    from openforge.sandbox.testing import proxy_socket_path

    if not bwrap_usable():
        pytest.skip("needs bubblewrap (a GUI sandbox is isolated)")
    monkeypatch.setenv("FORGE_NPM_CACHE", str(CACHE))  # the sandbox binds the harness cache read-only
    sock = str(tmp_path / "site.sock")
    site = Site(unix=sock)
    engine: Any = None

    def policy(input_ids: list[int]) -> str:
        prompt = engine.tokenizer.decode(input_ids)
        found = re.findall(r"\[(\d+)\]<button id=go", prompt)
        action = {"click": {"index": int(found[-1])}} if found and "Clicked" not in prompt.rsplit("<agent_history>", 1)[-1] \
            else {"done": {"text": "clicked", "success": True, "files_to_display": []}}
        return json.dumps({"thinking": "", "evaluation_previous_goal": "", "memory": "", "next_goal": "", "action": [action]})

    engine = ScriptedEngine(tiny_vl_model, policy)
    run = store.create_run(kind="eval")
    ro = store.create_rollout(run_id=run.id, task_id="button", status="running")
    harness = get_harness(HarnessConfig(name="browser-use", max_turns=4, npm_cache=str(CACHE)))

    async def go(proxy: ProxyServer) -> Any:
        async with LocalSandbox(LocalSandboxConfig(), run_id=run.id, rollout_id=ro.id, proxy_socket=proxy.uds) as sb:
            sb.attach_gui(GuiSpec(url=None, size=(1024, 768), site_socket=sock))
            ctx = HarnessContext(proxy_url=sb.proxy_url, api_key=ro.key, model="forge-policy",
                                 instruction="Press the red button on the site.", workdir=sb.info.workdir, backend="local")
            await harness.prepare(sb, ctx)
            result = await sb.exec(harness.command(ctx), env=harness.env(ctx), timeout=300)
            return result, await harness.outcome(result, sb)

    try:
        with serve_in_thread(engine.app) as eng, ProxyServer(ProxyConfig(max_context_tokens=65536), store_path=store.path,
                                                              engine_url=eng.url, model_path=tiny_vl_model,
                                                              uds=proxy_socket_path()) as proxy:
            result, outcome = asyncio.run(go(proxy))
    finally:
        site.close()
    assert (outcome.answer, outcome.failure) == ("clicked", None), (result.stdout[-3000:], result.stderr[-3000:])
    assert site.clicks == 1
    calls = store.list_calls(rollout_id=ro.id)
    assert len(calls) == 2 and [c.status for c in calls] == ["ok", "ok"]
    assert all(len(c.images) == 1 for c in calls)  # a screenshot each step, stored by the proxy


@pytest.mark.slow
@needs_browser_use
def test_browser_use_solves_a_builtin_web_task(tiny_vl_model: Path, store: Any,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """gui-colour-click-blue through the real RolloutRunner: the site on the host, the sandbox's display
    without a browser of its own (browser-use starts its own at FORGE_START_URL), the real proxy, a
    scripted engine that clicks the button browser-use lists where the page has its blue one (the
    task's button order), then says done. Graded by the site's state: scored 1.0."""
    import re

    from openforge.config import HarnessConfig
    from openforge.rollouts.tasks.format import load_tasks
    from openforge.rollouts.tasks.web.payload import WebPayload
    from tests.helpers.gui_fixtures import run_gui_task

    monkeypatch.setenv("FORGE_NPM_CACHE", str(CACHE))
    task = next(t for t in load_tasks("builtin-web") if t.id == "gui-colour-click-blue")
    blue = task.payload(WebPayload).gui.params["order"].index("blue")  # type: ignore[union-attr]

    def policy(engine: Any, input_ids: list[int]) -> str:
        prompt = engine.tokenizer.decode(input_ids)
        state = prompt.rsplit("<browser_state>", 1)[-1]
        buttons = re.findall(r"\[(\d+)\]<button", state)
        action = ({"click": {"index": int(buttons[blue])}} if len(buttons) == 4 else
                  {"done": {"text": "clicked", "success": True, "files_to_display": []}})
        return json.dumps({"thinking": "", "evaluation_previous_goal": "", "memory": "", "next_goal": "",
                           "action": [action]})

    ro, _ = run_gui_task(store, tiny_vl_model, policy, "gui-colour-click-blue",
                         HarnessConfig(name="browser-use", max_turns=4, npm_cache=str(CACHE)))
    assert (ro.status, ro.reward, ro.harness) == ("scored", 1.0, "browser-use"), (ro.error, ro.stdout[-3000:], ro.stderr[-3000:])
    calls = store.list_calls(rollout_id=ro.id)
    assert len(calls) == 2 and all(len(c.images) == 1 for c in calls)


@needs_browser_use
def test_forge_harness_install_browser_use_is_a_noop_when_present(tmp_path: Path) -> None:
    import subprocess
    import sys

    forge = Path(sys.executable).with_name("forge")
    done = subprocess.run([str(forge), "harness", "install", "browser-use", "--cache", str(CACHE)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "FORGE_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert f"browser-use ready: {PYTHON}" in done.stdout
