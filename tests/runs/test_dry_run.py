"""`forge up --dry-run` / `forge train --dry-run` on the recipes in examples/: the plan, every check, the
Kubernetes manifests validated, and nothing started (no run row, no model built, no engine)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers.paths import REPO
from openforge.config import load_config
from openforge.forge_cli.main import app
from openforge.runs.plan import plan_run

EXAMPLES = REPO / "examples"
NO_GPU = not __import__("torch").cuda.is_available()


def dry_run(*args: str):
    return CliRunner().invoke(app, list(args))


def _lines(output: str) -> list[str]:
    return [line.strip() for line in output.splitlines()]


def test_the_laptop_recipe_plans_and_passes_with_nothing_started(forge_home: Path) -> None:
    # isolation = none: the plan is the same whether or not this machine has a working bubblewrap
    res = dry_run("--config", str(EXAMPLES / "laptop-demo.toml"), "--set", "sandbox.isolation=none", "up", "--dry-run",
                  "--no-harness-check")
    assert res.exit_code == 0, res.output
    lines = _lines(res.output)
    for expected in ("kind          embedded", "replicas      1 embedded engine", "backend       local",
                     "concurrency   8 rollouts at once", "ranks         1 (one process, no FSDP)",
                     "steps         12 x 2 tasks x 8 rollouts = 16 rollouts a step", "tasks         2: 2 exact",
                     "online-only   0", "backends      none (the run store only)"):
        assert expected in lines, (expected, res.output)
    assert "FAIL" not in res.output and lines[-1] == "nothing was started; every check passed"
    assert not (forge_home / "forge.db").exists() and not (forge_home / "models").exists()  # no run, no model
    assert dry_run("--config", str(EXAMPLES / "laptop-demo.toml"), "--set", "sandbox.isolation=none", "train",
                   "--dry-run", "--no-harness-check").exit_code == 0


def test_the_claw_recipe_renders_valid_pod_manifests_and_lists_every_failing_check(forge_home: Path) -> None:
    pytest.importorskip("kubernetes_validate")  # a dev dependency
    config = load_config(EXAMPLES / "claw-qwen3-moe.toml")
    plan = plan_run(config, forge_home)
    pod, policy = plan.manifests
    assert (pod["kind"], policy["kind"]) == ("Pod", "NetworkPolicy")
    [container] = pod["spec"]["containers"]
    assert container["image"] == "REGISTRY/openforge:0.1.0" and pod["metadata"]["namespace"] == "openforge"
    assert container["resources"]["limits"]["cpu"] == "2" and container["resources"]["requests"]["memory"] == "2Gi"
    verdicts = {c.name: (c.verdict, c.detail) for c in plan.checks}
    assert verdicts["Pod manifest"] == ("ok", "valid for Kubernetes 1.37")
    assert verdicts["NetworkPolicy manifest"] == ("ok", "valid for Kubernetes 1.37")
    assert verdicts["model"][0] == "missing" and "/models/policy" in verdicts["model"][1]
    assert verdicts["tasks"][0] == "missing" and "/data/tasks" in verdicts["tasks"][1]
    assert dict(plan.sections["trainer"])["ranks"] == "8 under torchrun, FSDP2"
    assert dict(plan.sections["engine"])["router"] == "http://sglang-router.openforge:30000 (a cluster's; forge " \
                                                      "starts no workers)"
    res = dry_run("--config", str(EXAMPLES / "claw-qwen3-moe.toml"), "up", "--dry-run")
    assert res.exit_code == 1, res.output
    assert '"kind": "Pod"' in res.output and '"kind": "NetworkPolicy"' in res.output
    assert any(line.startswith("FAIL  model: engine.model /models/policy") for line in _lines(res.output))
    assert "check(s) would stop this run; nothing was started" in res.output
    assert not (forge_home / "forge.db").exists()


def test_a_pod_the_api_server_would_refuse_fails_the_dry_run(forge_home: Path) -> None:
    config = load_config(EXAMPLES / "claw-qwen3-moe.toml", sets=["sandbox.cpu_limit=lots"])
    plan = plan_run(config, forge_home)
    [check] = [c for c in plan.checks if c.name == "pod manifest"]
    assert check.verdict == "missing" and "lots" in check.detail
    assert plan.manifests == []


def test_the_gui_recipe_plans_its_entropy_bonus_and_needs_gpus(forge_home: Path) -> None:
    plan = plan_run(load_config(EXAMPLES / "gui-qwen-vl.toml"), forge_home)
    trainer = dict(plan.sections["trainer"])
    assert trainer["loss"].startswith("lr 1e-05 (constant), KL 0, entropy 0.001,")
    assert dict(plan.sections["tasks"])["tasks"] == "17: 17 gui"
    assert dict(plan.sections["engine"])["GPUs"] == "1 (tensor parallel)"
    gpu = [c for c in plan.checks if c.name == "GPU"]
    assert len(gpu) == 2  # the SGLang engine's and the trainer's
    if NO_GPU:
        assert all(c.verdict == "missing" and "this machine has 0" in c.detail for c in gpu)
    assert any(c.name == "SGLang" for c in plan.checks) and plan.failed


def test_a_tracking_backend_that_is_not_installed_fails_the_dry_run(forge_home: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import openforge.runs.tracking as tracking

    monkeypatch.setitem(tracking._MODULES, "wandb", ("openforge_no_such_module", "wandb"))
    config = load_config(EXAMPLES / "laptop-demo.toml", sets=['tracking.backends=["wandb"]', "sandbox.isolation=none"])
    plan = plan_run(config, forge_home)
    assert [c.name for c in plan.failed] == ["tracking"]
    assert "pip install 'openforge[wandb]'" in plan.failed[0].detail
    assert dict(plan.sections["tracking"])["backends"] == "wandb"


def test_a_missing_wandb_key_is_a_warning_of_the_offline_fallback(forge_home: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    config = load_config(EXAMPLES / "laptop-demo.toml", sets=['tracking.backends=["wandb"]', "sandbox.isolation=none"])
    [check] = [c for c in plan_run(config, forge_home).checks if c.name == "W&B key"]
    assert check.verdict == "warn" and "log to W&B offline" in check.detail
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert not [c for c in plan_run(config, forge_home).checks if c.name == "W&B key"]


def test_dry_run_with_resume_is_one_line(forge_home: Path) -> None:
    res = dry_run("up", "--dry-run", "--resume", "latest")
    assert res.exit_code == 1
    assert res.stderr.startswith("forge: error: --dry-run plans a new run from the config")
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(importlib.util.find_spec("kubernetes_validate") is None, reason="kubernetes-validate missing")
def test_every_recipe_has_a_plan(forge_home: Path) -> None:
    for path in sorted(EXAMPLES.glob("*.toml")):
        plan = plan_run(load_config(path), forge_home)
        assert set(plan.sections) == {"engine", "sandboxes", "trainer", "tasks", "tracking"}, path
        assert all(c.verdict in ("ok", "warn", "missing") for c in plan.checks)


def test_a_sandbox_image_that_is_not_built_fails_the_dry_run(forge_home: Path) -> None:
    from openforge.errors import SandboxError
    from openforge.sandbox.docker_engine import connect
    from tests.helpers.required import skip_or_fail

    try:
        connect(timeout=10).close()
    except SandboxError as exc:
        skip_or_fail("docker", f"{exc} (CI starts dockerd in .ci/run and exports DOCKER_HOST)")
    res = dry_run("--set", "sandbox.type=docker", "--set", "sandbox.image=openforge-never-built:0", "up", "--dry-run")
    assert res.exit_code == 1, res.output
    [line] = [ln for ln in _lines(res.output) if ln.startswith("FAIL")]
    assert line.startswith("FAIL  Docker engine: the sandbox image openforge-never-built:0 is not on the Docker engine")
    assert line.endswith("build it with `forge sandbox build-image`")
