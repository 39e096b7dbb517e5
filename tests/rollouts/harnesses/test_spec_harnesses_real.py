"""Harnesses forge runs from a spec file alone, through their real programs: mini-swe-agent (PyPI) and
opencode (npm), each installed by `forge harness install` into the harness cache, then one rollout
through RolloutRunner -> local sandbox -> the program -> proxy (tiny model's tokenizer, scripted
engine) -> verifier -> store: the calls are recorded and the rollout is graded.

Skipped (with the reason) where the registries cannot be reached; the cache is $FORGE_NPM_CACHE, else
~/.cache/openforge-npm, as for tests/rollouts/harnesses/test_real_harnesses.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from openforge.config import ForgeConfig, HarnessConfig
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import TaskSpec
from openforge.sandbox.testing import proxy_socket_path
from tests.helpers.required import skip_or_fail
from tests.helpers.proxy_rig import make_rig  # noqa: F401 - fixture
from tests.helpers.harnesses import COMMAND, MARK, NPM_CACHE

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

TASK = TaskSpec(id="proof", instruction="Write forge-ok into proof.txt.", verifier="grep -qx forge-ok proof.txt")


def install(name: str, requirement: str) -> None:
    """`forge harness install NAME` into the test cache (a no-op when it is there); skip if it fails."""
    from openforge.forge_cli.main import app

    out = CliRunner().invoke(app, ["harness", "install", name, "--cache", str(NPM_CACHE)])
    if out.exit_code != 0:
        skip_or_fail(requirement, f"forge harness install {name} failed here: {out.output.strip()[-300:]}")
    assert f"{name} ready: " in out.output


def tool_call(name: str, arguments: dict[str, Any]) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


async def run_rollout(rig: Any, name: str, **harness: Any) -> Any:
    config = ForgeConfig()
    config.harness = HarnessConfig(name=name, npm_cache=str(NPM_CACHE), **harness)
    runner = RolloutRunner(rig.store, config=config, proxy_url=rig.url, proxy_socket=rig.proxy.uds)
    [ro] = await runner.run(rig.rollout.run_id, [RolloutSpec(TASK, 0)])
    return ro


def check_recorded(rig: Any, ro: Any, api: str) -> None:
    calls = [c for c in rig.calls(ro.id) if c.status == "ok"]
    assert calls and {c.api for c in calls} == {api}
    trajectories = rig.store.list_trajectories(rollout_ids=[ro.id])  # opencode's side calls: segments of their own
    assert trajectories and sum(len(t.call_ids) for t in trajectories) == len(calls)


async def test_mini_swe_agent_runs_from_its_spec(make_rig):
    install("mini-swe-agent", "pypi")
    rig = make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=400_000)
    tok = rig.engine.tokenizer
    finish = tool_call("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && echo proof written"})
    rig.engine.script = lambda ids: finish if MARK in tok.decode(ids) else tool_call("bash", {"command": COMMAND})
    ro = await run_rollout(rig, "mini-swe-agent", max_turns=4)
    assert (ro.status, ro.reward, ro.harness) == ("scored", 1.0, "mini-swe-agent"), (ro.error, ro.stderr, ro.stdout)
    check_recorded(rig, ro, "openai_chat")


async def test_opencode_runs_from_its_spec(make_rig):
    install("opencode", "npm")
    rig = make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=400_000)
    tok = rig.engine.tokenizer
    call = tool_call("bash", {"command": COMMAND, "description": "write the proof"})
    rig.engine.script = lambda ids: "Done: proof.txt is written." if MARK in tok.decode(ids) else call
    ro = await run_rollout(rig, "opencode", max_turns=4)
    assert (ro.status, ro.reward, ro.harness) == ("scored", 1.0, "opencode"), (ro.error, ro.stderr, ro.stdout)
    check_recorded(rig, ro, "openai_chat")


# -- the same two programs in Docker, from the images `forge sandbox build-image --harness NAME` builds ---------

def built_image(name: str) -> str:
    """The tag of harness `name`'s image as .ci/run builds it from the test cache; skip (fail under
    FORGE_REQUIRE=docker) when the engine is not reachable or the image is not built."""
    from openforge.errors import HarnessError, SandboxError
    from openforge.rollouts.harnesses import harness_class, npm_harness
    from openforge.rollouts.harnesses.npm import image_layer
    from openforge.sandbox.docker_engine import connect
    from openforge.sandbox.harness_image import harness_tag, venv_tag
    from openforge.sandbox.container_images import has_image

    cls = harness_class(name)
    try:
        venv = cls.venv_layer(NPM_CACHE)
        tag = venv_tag(venv) if venv is not None else harness_tag(image_layer({name: npm_harness(name)}, NPM_CACHE))
    except HarnessError as exc:
        skip_or_fail("docker", f"no {name} image without {name} installed: {exc}")
    try:
        client = connect(timeout=10)
    except SandboxError as exc:
        skip_or_fail("docker", f"{exc} (CI starts dockerd in .ci/run and exports DOCKER_HOST)")
    try:
        if not has_image(client, tag):
            skip_or_fail("docker", f"{tag} is not built (forge sandbox build-image --harness {name} --no-latest)")
    finally:
        client.close()
    return tag


async def test_mini_swe_agent_runs_in_its_image(make_rig):
    """The venv of the local cache, in an image of its own: the image's python3 runs it as the sandbox's user."""
    from tests.helpers.containers import run_in_container

    rig = make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=400_000)
    tok = rig.engine.tokenizer
    finish = tool_call("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && echo proof written"})
    rig.engine.script = lambda ids: finish if MARK in tok.decode(ids) else tool_call("bash", {"command": COMMAND})
    ro, rig = await run_in_container(rig, "mini-swe-agent", image=built_image("mini-swe-agent"))
    assert (ro.status, ro.reward, ro.harness) == ("scored", 1.0, "mini-swe-agent"), (ro.error, ro.stderr[-2000:])
    check_recorded(rig, ro, "openai_chat")


async def test_opencode_runs_in_its_image(make_rig):
    from tests.helpers.containers import run_in_container

    rig = make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=400_000)
    tok = rig.engine.tokenizer
    call = tool_call("bash", {"command": COMMAND, "description": "write the proof"})
    rig.engine.script = lambda ids: "Done: proof.txt is written." if MARK in tok.decode(ids) else call
    ro, rig = await run_in_container(rig, "opencode", image=built_image("opencode"))
    assert (ro.status, ro.reward, ro.harness) == ("scored", 1.0, "opencode"), (ro.error, ro.stderr[-2000:])
    check_recorded(rig, ro, "openai_chat")
