"""Harbor environments that build something (RUN) built into forge sandbox images by `forge tasks import
harbor` (rollouts/tasks/harbor/image.py) with the real Docker engine, offline: the task then runs in its
image on the Docker backend and `validate --run`'s solved, hostile and forged-reward runs hold there; a
step that needs the network and a base that is not here are one line each; images are cached by what
the build reads."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest
from typer.testing import CliRunner

from openforge.config import ForgeConfig
from openforge.errors import TaskError
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import TaskSpec, load_tasks
from openforge.rollouts.tasks.harbor.image import parse_base_map
from openforge.rollouts.tasks.selfcheck import _StandInHarness, check_solutions
from openforge.sandbox.docker_engine import connect
from openforge.sandbox.testing import backend_config
from openforge.store import Store
from tests.helpers.required import skip_or_fail

BASE = "harbor-test-base:1"  # what the tasks' Dockerfiles name; mapped onto forge's python image

BUILT = """FROM {base}
WORKDIR /app
COPY seed.txt /app/seed.txt
RUN mkdir -p data && echo $(( $(cat seed.txt) * 6 )) > data/answer.txt
"""
ONLINE = """FROM {base}
WORKDIR /app
RUN python3 -c "import urllib.request; urllib.request.urlopen('http://deb.debian.org/', timeout=5)"
"""
TEST_SH = """#!/bin/bash
if [ "$(cat /app/out.txt 2>/dev/null)" = "$(cat /app/data/answer.txt)" ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""


def _task(root: Path, name: str, dockerfile: str, *, base: str = BASE, build_timeout_s: float = 300) -> Path:
    folder = root / name
    (folder / "environment").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "solution").mkdir()
    (folder / "task.toml").write_text('[verifier]\ntimeout_sec = 60\n[agent]\ntimeout_sec = 60\n'
                                      f'[environment]\nbuild_timeout_sec = {build_timeout_s}\n')
    (folder / "instruction.md").write_text("Copy the number in /app/data/answer.txt to /app/out.txt.\n")
    (folder / "environment" / "Dockerfile").write_text(dockerfile.format(base=base))
    (folder / "environment" / "seed.txt").write_text("7\n")
    (folder / "tests" / "test.sh").write_text(TEST_SH)
    (folder / "solution" / "solve.sh").write_text("cp /app/data/answer.txt /app/out.txt\n")
    return folder


@pytest.fixture(scope="module")
def python_image() -> str:
    config, why = backend_config("docker", image="python")
    if config is None:
        skip_or_fail("docker", why)
    return config.image  # type: ignore[union-attr]


def _import(src: Path, out: Path, python_image: str) -> tuple[int, str]:
    from forge_cli.main import app

    result = CliRunner().invoke(app, ["tasks", "import", "harbor", str(src), "--out", str(out),
                                      "--base", f"{BASE}={python_image}"])
    return result.exit_code, result.output


async def test_a_run_step_is_built_offline_and_the_task_runs_in_its_image(
        store: Store, tmp_path: Path, python_image: str, forge_home: Path) -> None:
    src = tmp_path / "set"
    _task(src, "built", BUILT)
    _task(src, "online", ONLINE)
    _task(src, "no-base", BUILT, base="nowhere-to-be-found:0")
    code, output = _import(src, tmp_path / "out", python_image)
    assert code == 0, output
    assert "3 task(s): 1 imported" in output and "2 refused" in output, output
    assert ("online: environment/Dockerfile line 3: RUN python3 -c \"import urllib.request" in output
            and "failed in forge's offline build (no network): exit 1; last output: urllib.error.URLError" in output
            and f"--base {BASE}=IMAGE" in output), output
    assert ("no-base: environment/Dockerfile line 1: FROM nowhere-to-be-found:0 is not on this machine" in output
            and "--base nowhere-to-be-found:0=IMAGE" in output), output
    [task] = load_tasks(str(tmp_path / "out"))
    assert task.image is not None and task.image.workdir == "/app" and task.files == {}
    record = json.loads((tmp_path / "out" / "built" / "task.json").read_text())
    assert record["image"]["tag"] == task.image.tag

    config = ForgeConfig(sandbox=backend_config("docker", image="python")[0])
    assert await check_solutions(store, config, [task]) == []  # solved 1.0; hostile and forged rewards 0
    [check] = store.list_runs()
    solved = store.list_rollouts(check.id, step=0)
    assert [(ro.sandbox, ro.status, ro.reward) for ro in solved] == [("docker", "scored", 1.0)]

    again_code, again = _import(src, tmp_path / "again", python_image)  # unchanged: found by its hash
    assert again_code == 0 and "(0 image(s) built, 1 cached)" in again, again
    assert load_tasks(str(tmp_path / "again"))[0].image == task.image
    # A context file changed (to a value no earlier run built): a new image, removed again after.
    (src / "built" / "environment" / "seed.txt").write_text(f"{secrets.randbelow(10**9)}\n")
    changed_code, changed = _import(src, tmp_path / "changed", python_image)
    assert changed_code == 0 and "(1 image(s) built, 0 cached)" in changed, changed
    new = load_tasks(str(tmp_path / "changed"))[0].image
    assert new is not None and new.tag != task.image.tag
    client = connect()
    try:
        client.images.remove(new.tag)
    finally:
        client.close()


def test_a_base_map_is_from_equals_image() -> None:
    assert parse_base_map(["ubuntu:24.04=my/ubuntu:tools", "python:3.13-slim = py"]) == {
        "ubuntu:24.04": "my/ubuntu:tools", "python:3.13-slim": "py"}
    for bad in ("ubuntu:24.04", "=x", "ubuntu="):
        with pytest.raises(TaskError, match="expected FROM=IMAGE"):
            parse_base_map([bad])


async def test_a_task_image_on_a_backend_that_cannot_run_it_is_infrastructure(store: Store) -> None:
    task = TaskSpec.model_validate({"id": "imaged", "instruction": "x", "verifier": "true",
                                    "image": {"tag": "openforge-harbor:imaged-0", "workdir": "/app"}})
    runner = RolloutRunner(store, config=ForgeConfig(), proxy_url="http://127.0.0.1:9",
                           harness=_StandInHarness({"imaged": "true"}))
    [ro] = await runner.run(store.create_run(kind="check", name="image").id, [RolloutSpec(task)])
    assert (ro.status, ro.failure_kind, ro.reward) == ("failed", "infra", None)
    assert "the local backend cannot run it; use sandbox.type = \"docker\"" in ro.error, ro.error


def test_a_build_past_build_timeout_sec_is_stopped_and_leaves_nothing(tmp_path: Path, python_image: str,
                                                                      forge_home: Path) -> None:
    token = secrets.token_hex(4)  # names this build's step and task among other builds on the engine
    src = tmp_path / "set"
    _task(src, f"slow-{token}", f"FROM {{base}}\nWORKDIR /app\nRUN echo {token} && sleep 30\n", build_timeout_s=2)
    code, output = _import(src, tmp_path / "out", python_image)
    # nothing imported: exit 1 (issue 43), the refusal named
    assert code == 1 and "build_timeout_sec = 2s and was stopped" in output and "none of its 1 task(s)" in output, output
    [line] = [ln for ln in output.splitlines() if ln.startswith(f"slow-{token}:")]
    assert line == (f"slow-{token}: environment/Dockerfile: the build ran past [environment] build_timeout_sec = 2s "
                    "and was stopped (no image tagged, its containers removed); a longer build needs a larger "
                    "build_timeout_sec in task.toml")
    client = connect()
    try:
        steps = [c for c in client.containers.list(all=True) if token in " ".join(c.attrs["Config"]["Cmd"] or [])]
        tags = [t for image in client.images.list() for t in image.tags if token in t]
    finally:
        client.close()
    assert (steps, tags) == ([], [])
