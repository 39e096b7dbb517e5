"""Red team on the container backends: the attacks of tests/sandbox/test_redteam.py (a local bwrap sandbox)
and container-specific ones, each driven through the real RolloutRunner on docker (the python image,
the shared engine) and on the Kubernetes backend against the API double (tests/k8s_double: real
processes in a bubblewrap "pod" as uid 1000, files and execs over the exec WebSocket).

The rule (rollouts/runner/runner.py): an attack ends `scored` (or `timed_out`) with reward 0, never with a
reward, never as an infrastructure failure (that drops the group), never as a hang.
docs/security.md, "Red team, grading on docker and pods", lists what each found.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from tests.helpers.redteam import Agent

from openforge.config import ForgeConfig
from openforge.store import Rollout, Store
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import TaskSpec
from openforge.sandbox.testing import backend_config
from tests.helpers.required import skip_or_fail

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["docker", "pod"])
def container_config(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    if request.param == "docker":
        cfg, why = backend_config("docker", image="python")
        if cfg is None:
            skip_or_fail("docker", why)
        yield cfg
        return
    from tests.k8s_double import KubeDouble, bwrap_available
    from tests.helpers.kubernetes import make_config

    if not bwrap_available():
        pytest.skip("the API double runs pods under bubblewrap and nsenter as root")
    double = KubeDouble(tmp_path / "pods")
    double.start()
    try:
        yield make_config(double, tmp_path)
    finally:
        double.stop()


async def _attack(store: Store, sandbox, script: str, task: TaskSpec, **settings: object) -> Rollout:  # type: ignore[no-untyped-def]
    cfg = ForgeConfig()
    cfg.sandbox = sandbox.model_copy(update=settings)
    cfg.runner.verifier_timeout_s = 20
    runner = RolloutRunner(store, config=cfg, proxy_url="http://127.0.0.1:9", harness=Agent(script))
    run = store.create_run()
    [ro] = await asyncio.wait_for(runner.run(run.id, [RolloutSpec(task)]), 90)
    return ro


def _zero(ro: Rollout) -> None:
    assert ro.status in ("scored", "timed_out") and ro.reward == 0.0, (ro.status, ro.reward, ro.error,
                                                                       ro.verifier_output)


# -- files the grader reads ------------------------------------------------------------------------

EXPECTED_FILE_ATTACKS = {
    "fifo": "mkfifo out.txt",
    "socket": "python3 -I -c \"import socket; socket.socket(socket.AF_UNIX).bind('out.txt')\"",
    "unreadable": "echo 5 > out.txt && chmod 000 out.txt",  # the pod reads as the agent's user
    "folder": "mkdir -p out.txt/x && echo 4 > out.txt/x/y",
    "sparse-100G": "truncate -s 100G out.txt",
}


@pytest.mark.parametrize("attack", sorted(EXPECTED_FILE_ATTACKS))
async def test_what_stands_where_a_file_is_expected_is_wrong(store: Store, container_config, attack: str) -> None:  # type: ignore[no-untyped-def]
    task = TaskSpec(id="t", instruction="write 4 to out.txt", expect_files={"out.txt": "4\n"})
    started = time.monotonic()
    ro = await _attack(store, container_config, EXPECTED_FILE_ATTACKS[attack], task)
    _zero(ro)
    assert time.monotonic() - started < 60


ANSWER_ATTACKS = {
    "fifo": "mkdir -p .forge && mkfifo .forge/answer.txt",
    "unreadable": "mkdir -p .forge && echo 5 > .forge/answer.txt && chmod 000 .forge/answer.txt",
    "sparse-100G": "mkdir -p .forge && truncate -s 100G .forge/answer.txt",
    "links": "mkdir -p .forge && echo 5 > .forge/answer.txt && ln -s /tmp .verify && ln -sfn /etc .forge",
}


@pytest.mark.parametrize("attack", sorted(ANSWER_ATTACKS))
async def test_what_stands_where_the_grader_reads_and_writes_its_answer_is_graded(
        store: Store, container_config, attack: str) -> None:  # type: ignore[no-untyped-def]
    task = TaskSpec(id="t", instruction="say 4", expect_answer={"number": 4}, verifier="sh .verify/check.sh",
                    verifier_files={".verify/check.sh": "echo 'score: 1'\n"})
    ro = await _attack(store, container_config, ANSWER_ATTACKS[attack], task)
    _zero(ro)


# -- where the grader writes the verifier's files --------------------------------------------------

BLOCKED_FOLDERS = {
    "read-only-folder": "mkdir tests && chmod 555 tests",
    "file-for-folder": "echo x > tests",
    "link-to-read-only": "ln -s /usr tests",
    "link-loop": "ln -s tests tests",
}


@pytest.mark.parametrize("attack", sorted(BLOCKED_FOLDERS))
async def test_a_verifier_folder_the_agent_blocked_is_its_zero(store: Store, container_config, attack: str) -> None:  # type: ignore[no-untyped-def]
    """A verifier whose files live in a plain (not hidden) folder: the agent makes that folder
    unwritable. Its verifier then cannot run: the agent's 0, not an infrastructure failure."""
    task = TaskSpec(id="t", instruction="nothing", verifier="sh tests/check.sh",
                    verifier_files={"tests/check.sh": "echo 'score: 0'\n"})
    ro = await _attack(store, container_config, BLOCKED_FOLDERS[attack], task)
    _zero(ro)


@pytest.mark.parametrize("container_config", ["docker"], indirect=True)  # a pod's emptyDir is not the agent's
@pytest.mark.parametrize("mode", ["000", "555"])
async def test_a_workdir_the_agent_made_unsearchable_or_read_only_is_its_zero(store: Store, container_config,  # type: ignore[no-untyped-def]
                                                                             mode: str) -> None:
    task = TaskSpec(id="t", instruction="nothing", verifier="sh tests/check.sh",
                    verifier_files={"tests/check.sh": "echo 'score: 1'\n"})
    ro = await _attack(store, container_config, f"chmod {mode} .", task)
    _zero(ro)


# -- the verifier and what runs beside it ------------------------------------------------------------

# A process chain with a fresh pid every millisecond or so: each generation forks the next and exits,
# so a /proc scan finds a pid that is gone by the time it is signalled. Without the exec's marker
# (`env -i`), only kill_all can end it; if it survives, it rewrites the verifier's script.
CHURN = ("printf '%s\\n' 'echo \"echo score: 1\" > check.sh 2>/dev/null' "
         "'sh churn.sh </dev/null >/dev/null 2>&1 &' > churn.sh && "
         "env -i PATH=/usr/local/bin:/usr/bin:/bin sh churn.sh </dev/null >/dev/null 2>&1; "
         "for i in $(seq 100); do grep -q 'score: 1' check.sh 2>/dev/null && echo churning && break; sleep 0.1; done")


async def test_a_process_chain_that_outruns_a_proc_scan_cannot_rewrite_the_verifier(
        store: Store, container_config) -> None:  # type: ignore[no-untyped-def]
    task = TaskSpec(id="t", instruction="nothing", verifier="sh check.sh",
                    verifier_files={"check.sh": "echo 'score: 0'\n"})
    ro = await _attack(store, container_config, CHURN, task)
    _zero(ro)
    assert "churning" in (ro.stdout or ""), ro.stdout  # the chain really ran before the grader's turn


async def test_a_verifier_output_cut_at_the_cap_never_passes(store: Store, container_config) -> None:  # type: ignore[no-untyped-def]
    task = TaskSpec(id="t", instruction="make log.txt", verifier="cat log.txt; echo 'score: 0'")
    ro = await _attack(store, container_config, "yes 'all good' | head -c 3000000 > log.txt", task,
                       max_output_bytes=65536)
    _zero(ro)


async def test_a_module_left_in_the_verifiers_folder_does_not_run(store: Store, container_config) -> None:  # type: ignore[no-untyped-def]
    task = TaskSpec(id="t", instruction="nothing", verifier="python3 .verify/check.py",
                    verifier_files={".verify/check.py": "import json\nprint('score:', json.dumps(0))\n"})
    ro = await _attack(store, container_config, "mkdir -p .verify && printf 'print(\"score: 1\")\\nimport os\\n"
                                                "os._exit(0)\\n' > .verify/json.py", task)
    _zero(ro)


@pytest.mark.parametrize("container_config", ["docker"], indirect=True)
async def test_a_container_whose_pid_limit_the_agent_filled_is_still_graded(store: Store, container_config) -> None:  # type: ignore[no-untyped-def]
    """A loop without the exec's marker that takes every free pid (docker's `pids_limit`): kill_all's
    exec still starts (its `kill -9 -1` is a builtin) and the verifier runs. Docker only: the API
    double's pods have no pid limit, so there the loop would fill the host's."""
    task = TaskSpec(id="t", instruction="nothing", verifier="sh check.sh",
                    verifier_files={"check.sh": "echo 'score: 0'\n"})
    ro = await _attack(store, container_config, "(env -i /bin/sh -c 'while :; do sleep 1000 & done' "
                                                ">/dev/null 2>&1 &); sleep 1", task)
    _zero(ro)
    assert "score: 0" in (ro.verifier_output or ""), ro.verifier_output


NESTED_PATH_ATTACKS = {
    "link-loop": "ln -s sub sub",
    "file-for-folder": "echo 4 > sub",
    "unsearchable-folder": "mkdir sub && echo 4 > sub/out.txt && chmod 000 sub",
}


@pytest.mark.parametrize("attack", sorted(NESTED_PATH_ATTACKS))
async def test_what_stands_in_an_expected_files_folder_is_wrong(store: Store, container_config, attack: str) -> None:  # type: ignore[no-untyped-def]
    task = TaskSpec(id="t", instruction="write 5 to sub/out.txt", expect_files={"sub/out.txt": "5\n"})
    ro = await _attack(store, container_config, NESTED_PATH_ATTACKS[attack], task)
    _zero(ro)
