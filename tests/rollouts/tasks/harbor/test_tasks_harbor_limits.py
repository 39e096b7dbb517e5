"""Harbor's `[environment]` cpus / memory / storage as the task's sandbox limits (sandbox/limits.py): read
as Harbor reads them (its deprecated "4G" forms included), sized per backend, and honoured inside the
sandbox on local (bubblewrap) and Docker, where the task's own test.sh measures them; and what
`forge tasks import harbor` refuses by name rather than passing over (a step without tests, heredocs)."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from openforge.config import DockerSandboxConfig, ForgeConfig, KubernetesSandboxConfig, LocalSandboxConfig
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import load_tasks, validate_tasks
from openforge.rollouts.tasks.harbor.image import ImageBuildFailed, build_task_image, import_harbor
from openforge.rollouts.tasks.selfcheck import _StandInHarness
from openforge.sandbox.docker import DockerSandbox
from openforge.sandbox.kubernetes import KubernetesSandbox
from openforge.sandbox.limits import TaskLimits, host_cpus, storage_notice
from openforge.sandbox.local import LocalSandbox
from openforge.sandbox.testing import backend_config
from openforge.store import Store
from tests.helpers.required import skip_or_fail

LIMITS = """
[environment]
cpus = 1
memory = "256M"
storage_mb = 2
"""

# Each limit measured by what it stops, in the sandbox, after the agent: a single core (nproc under
# affinity; the CFS quota of a container, v2 or v1), no 3 MB file under 2 MB of storage, no 600 MB under 256 MB;
# and what storage_mb is not, as `storage_notice` says: three 1 MB files still fit (no quota on the total).
MEASURE = """
ok=1
grep -qx hello /app/answer.txt || { ok=0; echo "no answer"; }
quota=$(cut -d' ' -f1 /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null)
[ "$(nproc)" = 1 ] || [ "$quota" = 100000 ] || { ok=0; echo "cores"; }
head -c 1000000 /dev/zero > /tmp/small || { ok=0; echo "no 1 MB file"; }
(head -c 3000000 /dev/zero > /tmp/big) 2>/dev/null && { ok=0; echo "a 3 MB file"; }
for i in 1 2 3; do head -c 1000000 /dev/zero > /tmp/part$i || { ok=0; echo "a quota on the total"; }; done
python3 -c "b = b'x' * (600 << 20)" 2>/dev/null && { ok=0; echo "600 MB"; }
echo $ok > /logs/verifier/reward.txt
"""


def _task(root: Path, name: str, *, toml: str = "", test_sh: str = "echo 1 > /logs/verifier/reward.txt\n") -> Path:
    folder = root / name
    (folder / "environment").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 60\n' + textwrap.dedent(toml))
    (folder / "instruction.md").write_text("Write hello to /app/answer.txt.\n")
    (folder / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    (folder / "tests" / "test.sh").write_text("#!/bin/bash\n" + textwrap.dedent(test_sh))
    return folder


def test_environment_limits_are_read_as_harbor_reads_them(tmp_path: Path) -> None:
    root = tmp_path / "set"
    _task(root, "sized", toml='[environment]\ncpus = 2\nmemory = "4G"\nstorage_mb = 10240\n')
    _task(root, "some", toml="[environment]\nmemory_mb = 512\nallow_internet = false\n")
    _task(root, "none")
    _task(root, "bad-size", toml='[environment]\nstorage = "lots"\n')
    _task(root, "bad-cpus", toml="[environment]\ncpus = 0\n")
    problems = {p.task_id: p.message for p in validate_tasks(root)}
    assert problems.keys() == {"bad-size", "bad-cpus"}
    assert "storage = 'lots': expected a size like '1G' or '512M'" in problems["bad-size"]
    assert "cpus" in problems["bad-cpus"] and all("\n" not in m for m in problems.values())
    for bad in ("bad-size", "bad-cpus"):
        shutil.rmtree(root / bad)
    tasks = {t.id: t.limits for t in load_tasks(root) if t.id in ("sized", "some", "none")}
    assert tasks == {"sized": TaskLimits(cpus=2, memory_mb=4096, storage_mb=10240),
                     "some": TaskLimits(memory_mb=512), "none": None}


def test_each_backend_sizes_its_sandbox_to_the_task() -> None:
    need = TaskLimits(cpus=1.5, memory_mb=300, storage_mb=5)
    local = LocalSandbox.with_limits(LocalSandboxConfig(), need)
    assert (local.cpus, local.memory_mb, local.max_file_mb) == (min(2, host_cpus()), 300, 5)
    assert LocalSandbox.with_limits(LocalSandboxConfig(), TaskLimits(memory_mb=64)) == LocalSandboxConfig(memory_mb=64)
    docker = DockerSandbox.with_limits(DockerSandboxConfig(), need)
    assert (docker.cpus, docker.memory_mb, docker.max_file_mb) == (min(1.5, host_cpus()), 300, 5)
    assert DockerSandbox.with_limits(DockerSandboxConfig(), TaskLimits(cpus=10_000)).cpus == host_cpus()
    pod = KubernetesSandbox.with_limits(KubernetesSandboxConfig(), need)
    assert (pod.cpu_request, pod.cpu_limit, pod.memory_limit, pod.ephemeral_storage_limit) == ("1500m", "1500m", "300Mi",
                                                                                                  "5Mi")


@pytest.mark.parametrize("backend", ["local-bwrap", "docker"])
async def test_the_task_s_limits_hold_in_its_sandbox(backend: str, store: Store, tmp_path: Path) -> None:
    config, why = backend_config(backend, image="python")
    if config is None:
        skip_or_fail("docker", why) if backend == "docker" else pytest.skip(why)
    if backend == "docker":  # the run's containers get half a core: the task's one core must replace it
        config = config.model_copy(update={"cpus": 0.5})
    root = tmp_path / "set"
    _task(root, "sized", toml=LIMITS, test_sh=MEASURE)
    _task(root, "unsized", test_sh=MEASURE)  # the same measurements under the run's limits: they do not hold
    tasks = load_tasks(root)
    run = store.create_run(kind="check")
    runner = RolloutRunner(store, config=ForgeConfig(sandbox=config), proxy_url="http://127.0.0.1:9",
                           harness=_StandInHarness({t.id: "echo hello > answer.txt" for t in tasks}))
    out = await runner.run(run.id, [RolloutSpec(t) for t in tasks])
    got = {ro.task_id: (ro.status, ro.reward, ro.error) for ro in out}
    assert got == {"sized": ("scored", 1.0, None), "unsized": ("scored", 0.0, None)}, [ro.verifier_output for ro in out]


def test_import_names_multi_step_tasks_it_cannot_run(tmp_path: Path) -> None:
    root = tmp_path / "set"
    steps = root / "turns"
    (steps / "steps" / "1_first").mkdir(parents=True)
    (steps / "task.toml").write_text('schema_version = "1.1"\n[[steps]]\nname = "1_first"\n')
    (steps / "steps" / "1_first" / "instruction.md").write_text("Do the first turn.\n")
    report = import_harbor(root)
    # a multi-step task is imported (tests/rollouts/tasks/harbor/test_tasks_harbor_steps.py); one whose step has no tests is refused
    assert (report.tasks, report.refused) == ([], [("turns", "step '1_first': no steps/1_first/tests/test.sh "
                                                                "nor tests/test.sh")])


def test_a_heredoc_is_refused_in_one_line_before_any_build(tmp_path: Path) -> None:
    config, why = backend_config("docker", image="python")
    if config is None:
        skip_or_fail("docker", why)
    folder = _task(tmp_path, "heredoc")
    (folder / "environment" / "Dockerfile").write_text(
        f"FROM {config.image}\nWORKDIR /app\nRUN python3 << 'PY'\nprint('hi')\nPY\n")  # type: ignore[union-attr]
    with pytest.raises(ImageBuildFailed) as err:
        build_task_image(folder, "/app")
    assert str(err.value).startswith("environment/Dockerfile line 3: RUN python3 << 'PY' is a heredoc (BuildKit syntax)")


def test_forge_says_storage_mb_is_no_disk_quota_in_one_line(tmp_path: Path, forge_home: Path) -> None:
    from typer.testing import CliRunner

    from forge_cli.main import app

    root = tmp_path / "set"
    _task(root, "sized", toml=LIMITS)
    _task(root, "plain")
    out = CliRunner().invoke(app, ["--set", "sandbox.type=docker", "tasks", "validate", str(root)])
    assert out.exit_code == 0, out.output
    [note] = [line for line in out.output.splitlines() if line.startswith("note:")]
    assert note == ("note: 1 task(s) declare storage_mb (sized); it is not a disk quota: on docker, a cap on each "
                    "file's size (--ulimit fsize), not on the total written: the writable folders are volumes with no size")
    imported = CliRunner().invoke(app, ["tasks", "import", "harbor", str(root), "--out", str(tmp_path / "out")])
    assert imported.exit_code == 0, imported.output
    [note] = [line for line in imported.output.splitlines() if line.startswith("note:")]
    assert "on local, a cap on each file's size (RLIMIT_FSIZE)" in note and "on docker, " in note, note
    shutil.rmtree(root / "sized")
    quiet = CliRunner().invoke(app, ["tasks", "validate", str(root)])
    assert quiet.exit_code == 0 and "note:" not in quiet.output, quiet.output
    assert storage_notice(["a", "b", "c", "d"], "local") == (
        "note: 4 task(s) declare storage_mb (a, b, c and 1 more); it is not a disk quota: on local, a cap on each "
        "file's size (RLIMIT_FSIZE), not on the total written: the sandbox's folders are host folders with no quota")
