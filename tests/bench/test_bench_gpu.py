"""bench/gpu (issue 48): the GPU check's dry run on the CPU, so a change that would break the GPU run
fails here first, and the prepared device call in docs/performance.md stays one the device accepts."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from tests.helpers.paths import REPO

ROOT = REPO
GPU = ROOT / "bench" / "gpu"
PARTS = ["build qwen3-1.7b", "decode qwen3-1.7b", "prefix cache", "grpo batch", "grpo step forge", "lora hot-load",
         "grpo step trl", "grpo step forge fsdp2", "build qwen2.5-7b", "decode qwen2.5-7b"]


@pytest.mark.slow
def test_dry_run_runs_every_part_of_the_gpu_check(tmp_path):
    """run.sh --dry-run, as the device runs it (namespace of links, no current folder on sys.path)."""
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(GPU / "run.sh"), "--dry-run", "--out", str(tmp_path)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    record = json.loads((tmp_path / "gpu.json").read_text())
    res = record["results"]
    status = {p["part"]: p["status"] for p in res["parts"]}
    assert list(status) == PARTS
    trl_here = importlib.util.find_spec("trl") is not None
    for part, state in status.items():
        if part == "grpo step trl" and not trl_here:
            assert state.startswith("skipped: trl/datasets not importable"), state
        else:
            assert state == "ok", (part, state)
    plan = res["plan"]
    for model in ("qwen3-1.7b", "qwen2.5-7b"):
        rows = res[f"decode {model}"]["rows"]
        assert [r["batch"] for r in rows] == [1, 8, 32]
        assert all(r["engine_tokens_per_s"] > 0 and r["generate_tokens_per_s"] > 0 for r in rows)
    assert res["build qwen3-1.7b"]["shape"]["model_type"] == "qwen3"
    assert res["build qwen2.5-7b"]["shape"]["model_type"] == "qwen2"
    cache = res["prefix cache"]
    # Off: every rollout prefills the whole prompt; on: the group computes it about once.
    assert cache["cache_off"]["prefill_tokens_computed"] >= 8 * cache["prompt_tokens"]
    assert cache["cache_on"]["prefill_tokens_computed"] < 2 * cache["prompt_tokens"]
    sampled = plan["tasks"] * plan["group"] * plan["train_new_tokens"]
    assert res["grpo batch"]["sampled_tokens"] == sampled
    ours, fsdp = res["grpo step forge"], res["grpo step forge fsdp2"]
    assert ours["tokens_per_step"] == fsdp["tokens_per_step"] == sampled and ours["steps"] == plan["steps"]
    # fp32 engine and trainer on the CPU: the same numbers up to float rounding, so no weight is capped.
    mismatch = ours["mismatch"]
    assert mismatch["tokens"] == sampled and mismatch["mismatch_max"] < 1e-4
    assert mismatch["with_tis"]["capped_share"] == 0.0
    assert res["lora hot-load"]["loads"] == 4 and res["lora hot-load"]["first_request_tokens"] == 1
    if trl_here:
        assert res["grpo step trl"]["tokens_per_step"] == sampled
    table = (tmp_path / "gpu.md").read_text()
    assert "| what | figure | forge | baseline | ratio | target |" in table and "≥ 5x fewer" in table


def _device_call() -> dict:
    text = (GPU / "prepared.md").read_text()
    blocks = re.findall(r"```json\n(.*?)\n```", text, re.S)
    assert len(blocks) == 1, "prepared.md holds exactly one device call"
    return json.loads(blocks[0])


def test_the_prepared_device_call_fits_the_device_and_is_in_the_performance_page():
    call = _device_call()
    assert set(call) == {"command", "carry", "timeout_s"}
    assert len(call["command"]) <= 2000 and len(call["carry"]) <= 8 and call["timeout_s"] <= 600
    assert "bench/gpu/run.sh --out $OUT" in call["command"] and call["carry"] == [".whl"]
    assert "--dry-run" not in call["command"]
    # The call's limit covers run.sh's own: parts start until the budget, a child runs at most its timeout.
    main = (GPU / "main.py").read_text()
    budget = float(re.search(r"budget_s: float = ([\d.]+)", main).group(1))
    child = float(re.search(r"child_timeout_s: float = ([\d.]+)", main).group(1))
    assert budget + child < call["timeout_s"]
    assert (GPU / "prepared.md").read_text() in (ROOT / "docs" / "performance.md").read_text()
    assert ".whl/" in (GPU / "prepare.sh").read_text()


def _forge_requirements() -> dict[str, list]:
    """Every requirement forge's pyproject states (dependencies and extras), by normalised name."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"]) + [r for extra in project["optional-dependencies"].values() for r in extra]
    found: dict[str, list] = {}
    for line in lines:
        req = Requirement(line)
        found.setdefault(canonicalize_name(req.name), []).append(req)
    return found


def test_carried_wheels_satisfy_forge_and_each_other():
    """wheels.txt pins what the device gets: one version of each, inside forge's own ranges, and inside the
    ranges the carried packages ask of each other (a lock, so a newer release on PyPI does not move it)."""
    pins = [line.split("==") for line in (GPU / "wheels.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    assert all(len(p) == 2 for p in pins), "every wheel is pinned with =="
    pinned = {canonicalize_name(n): Version(v) for n, v in pins}
    assert len(pinned) == len(pins), "one version of each"
    forge = _forge_requirements()
    for name, version in pinned.items():
        for req in forge.get(name, []):
            assert req.specifier.contains(version, prereleases=True), f"{name}=={version} is outside forge's {req}"
    # What a carried package asks of another carried one, read from this environment's metadata where the
    # installed version is the carried one (the others' metadata is not here to read; a newer release
    # installed by CI only narrows what is checked).
    for name, version in pinned.items():
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if Version(dist.version) != version:
            continue
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            other = canonicalize_name(req.name)
            if other in pinned:
                assert req.specifier.contains(pinned[other], prereleases=True), \
                    f"{name}=={version} needs {req}, wheels.txt carries {other}=={pinned[other]}"
