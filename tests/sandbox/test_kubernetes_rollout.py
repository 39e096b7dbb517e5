"""A whole rollout on the Kubernetes backend against the API double: ScriptedEngine -> real proxy on
loopback -> RolloutRunner -> a restricted pod (the mini harness's python and the openai SDK shared
into it read-only) -> graded. And an agent that blows the pod's memory limit: the rollout fails as
infra with the pod's OOMKilled in its error, not as a wrong answer."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from tests.k8s_double import IMAGE_ENV, KubeDouble
from tests.helpers.kubernetes import make_config, pytestmark  # noqa: F401

from openforge.engine.scripted import ScriptedEngine
from openforge.engine.serve import serve_in_thread
from openforge.config import ForgeConfig
from openforge.store import Store
from openforge.proxy.server import ProxyServer
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import load_tasks

WRITE_HELLO = ('<tool_call>\n{"name": "write_file", "arguments": {"path": "hello.txt", '
               '"content": "hello world\\n"}}\n</tool_call>')
HOG = ('<tool_call>\n{"name": "bash", "arguments": {"command": "python3 -c \\"import time; '
       'x = bytearray(300 << 20); time.sleep(30)\\""}}\n</tool_call>')


def rollout(tmp_path: Path, tiny_model: Path, store: Store, replies: list[str], **k8s):  # type: ignore[no-untyped-def]
    venv = tuple(sorted({sys.prefix, sys.base_prefix}))
    path = f"PATH={sys.prefix}/bin:" + IMAGE_ENV[0].removeprefix("PATH=")
    double = KubeDouble(tmp_path / "pods", ro_binds=venv, image_env=(path, *IMAGE_ENV[1:]), enforce_memory=True)
    double.start()
    engine = ScriptedEngine(tiny_model, replies)
    eng = serve_in_thread(engine.app)
    proxy = ProxyServer(ForgeConfig().proxy, store_path=store.path, engine_url=eng.url, model_path=tiny_model)
    proxy.start()
    try:
        # The double's pods share the host's network: the proxy's loopback address is reachable.
        sandbox = make_config(double, tmp_path, proxy_url=proxy.url, **k8s)
        cfg = ForgeConfig(sandbox=sandbox)
        task = next(t for t in load_tasks("builtin") if t.id == "med-create-file")
        run = store.create_run(kind="eval")
        [ro] = asyncio.run(RolloutRunner(store, config=cfg, proxy_url=proxy.url).run(run.id, [RolloutSpec(task)]))
        return ro, double
    finally:
        proxy.stop()
        eng.stop()
        double.stop()


def test_a_rollout_scores_in_a_restricted_pod(tmp_path: Path, tiny_model: Path, store: Store) -> None:
    ro, double = rollout(tmp_path, tiny_model, store, [WRITE_HELLO, "Done: hello world"])
    assert (ro.status, ro.reward, ro.exit_code) == ("scored", 1.0, 0), (ro.error, ro.stderr[-2000:])
    assert [c.status for c in store.list_calls(rollout_id=ro.id)] == ["ok", "ok"]
    assert not double.pods  # deleted, gracefully, before the runner returned


def test_an_oom_kill_fails_the_rollout_as_infra_saying_so(tmp_path: Path, tiny_model: Path, store: Store) -> None:
    ro, _ = rollout(tmp_path, tiny_model, store, [HOG, "Done"], memory_request="64Mi", memory_limit="128Mi")
    assert ro.status == "failed" and ro.failure_kind == "infra", (ro.status, ro.error)
    assert "OOMKilled" in ro.error and "memory limit 128Mi" in ro.error


def test_a_harbor_tasks_tests_never_load_the_agents_pytest_files_in_a_pod(tmp_path: Path, store: Store) -> None:
    """Issue 43 on this backend: the tests go into the pod's grader folder, emptied once the agent is gone, so
    a conftest.py, pytest.py and pytest.ini in every folder the agent could write (that one included) fail."""
    from tests.helpers.harbor import _pytest_task

    from openforge.rollouts.tasks.harbor.kind import PLANTED_PYTEST
    from openforge.rollouts.tasks.selfcheck import _StandInHarness

    double = KubeDouble(tmp_path / "pods", ro_binds=tuple(sorted({sys.prefix, sys.base_prefix})))
    double.start()
    try:
        cfg = ForgeConfig(sandbox=make_config(double, tmp_path))
        _pytest_task(tmp_path / "set")
        [task] = load_tasks(tmp_path / "set")
        agents = {"honest": "echo 42 > answer.txt", "conftest": "printf 'import os\\nos._exit(0)\\n' > conftest.py",
                  "planted": PLANTED_PYTEST}
        runner = RolloutRunner(store, config=cfg, proxy_url="http://127.0.0.1:9", harness=_StandInHarness(agents))
        out = asyncio.run(runner.run(store.create_run(kind="check").id,
                                     [RolloutSpec(task.model_copy(update={"id": label})) for label in agents]))
    finally:
        double.stop()
    assert {ro.task_id: (ro.status, ro.reward) for ro in out} == {
        "honest": ("scored", 1.0), "conftest": ("scored", 0.0), "planted": ("scored", 0.0)}, [
        (ro.error, ro.verifier_output) for ro in out]
