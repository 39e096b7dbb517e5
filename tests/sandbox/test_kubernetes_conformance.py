"""The sandbox interface's conformance checks (tests/sandbox/test_sandbox.py), run unchanged on the Kubernetes
backend against the API double, plus the cleanup checks that look at pods instead of containers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psutil
import pytest
from tests.k8s_double import KubeDouble

# The double fixture and the module marks (skip without bubblewrap/root, timeout) are test_kubernetes's.
from tests.helpers.kubernetes import double, make_config, pytestmark  # noqa: F401

# Collected here again with this module's `config` fixture: the same checks as on local and docker.
from tests.sandbox.test_sandbox import (  # noqa: F401
    test_environment_does_not_leak_from_the_caller, test_exec_before_start_is_a_clear_error,
    test_exec_exit_codes_streams_env_cwd_stdin, test_files_round_trip_binary_and_text,
    test_output_cap_keeps_the_head_and_says_so, test_paths_cannot_escape_the_workdir,
    test_timeout_kills_the_command_and_its_children,
)

from openforge.config import KubernetesSandboxConfig as SandboxConfig
from openforge.sandbox import make_sandbox

@pytest.fixture
def config(double: KubeDouble, tmp_path: Path) -> SandboxConfig:
    return make_config(double, tmp_path)


def pod_is_gone(double: KubeDouble, pod) -> bool:  # type: ignore[no-untyped-def]
    # The container's PID 1 gone means its PID namespace, and every process in it, is gone.
    return (pod.ns, pod.name) not in double.pods and not psutil.pid_exists(pod.ns_pid) \
        and all(p.returncode is not None for p in pod.procs) and not pod.root.exists()


async def test_stop_removes_the_pod_and_everything_in_it(double: KubeDouble, config: SandboxConfig) -> None:
    sb = make_sandbox(config, run_id="run-test", rollout_id="ro-stop")
    await sb.start()
    pod = double.pods[("openforge", sb.info.sandbox_id)]
    # A daemon that escaped the exec's reaping would still die with the pod.
    await sb.exec("(setsid sleep 60 >/dev/null 2>&1 &) ; sleep 60 >/dev/null 2>&1 &", timeout=10)
    await sb.stop()
    await sb.stop()
    assert pod_is_gone(double, pod)


async def test_cancellation_inside_the_context_still_deletes_the_pod(double: KubeDouble,
                                                                     config: SandboxConfig) -> None:
    sb = make_sandbox(config, run_id="run-test", rollout_id="ro-cancel")
    pods = []

    async def rollout_body() -> None:
        async with sb:
            pods.append(double.pods[("openforge", sb.info.sandbox_id)])
            await sb.exec("sleep 60", timeout=30)

    task = asyncio.ensure_future(rollout_body())
    await asyncio.sleep(1.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pods and pod_is_gone(double, pods[0])


async def test_the_agent_killing_all_it_can_does_not_end_its_pod(config: SandboxConfig) -> None:
    """As on docker (test_sandbox_isolation): the pod's PID 1 is beyond the agent's signals, so
    `kill -9 -1` cannot end the pod and turn the agent's zero into an infrastructure failure."""
    async with make_sandbox(config, run_id="run-test", rollout_id="ro-killall") as sb:
        done = await sb.exec("sleep 30 & kill -9 1; kill -9 -1; echo survived", timeout=30)
        assert not done.timed_out, done
        await asyncio.sleep(0.3)
        assert (await sb.exec("echo alive", timeout=10)).stdout == "alive\n"
