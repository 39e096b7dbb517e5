"""runs/ as a library, below the CLI: collect.py's counts, sft.py's kept threshold and who trains, session.py's
lines, harness_check.py's sampling warnings, model_export.py's refusals (with trainer/model_export.py's PEFT copy)."""

from __future__ import annotations

from pathlib import Path

import pytest

from openforge.config import ForgeConfig
from openforge.errors import ConfigError, ForgeError
from openforge.runs.collect import collect_counts
from openforge.runs.harness_check import sampling_warnings
from openforge.runs.model_export import export_model
from openforge.runs.session import session_summary, start_line
from openforge.runs.sft import kept_threshold, sft_elsewhere
from openforge.store import Call, Checkpoint, Store


def test_collect_counts_keep_what_reaches_the_bar_by_task_and_harness(store: Store) -> None:
    run = store.create_run(kind="collect")
    for task, harness, status, reward in [("a", "mini", "scored", 1.0), ("a", "mini", "scored", 0.0),
                                          ("b", "codex", "scored", 0.5), ("b", "codex", "failed", None)]:
        r = store.create_rollout(run_id=run.id, task_id=task, harness=harness)
        store.update_rollout(r.id, status=status, reward=reward)
    got = collect_counts(store, run.id, 0.5)
    assert (got["rollouts"], got["kept"]) == (3, 2)  # the failed rollout is no sample
    assert got["kept_by_task"] == {"a": {"scored": 2, "kept": 1}, "b": {"scored": 1, "kept": 1}}
    assert got["kept_by_harness"]["codex"] == {"scored": 1, "kept": 1}
    assert collect_counts(store, run.id, 1.0)["kept"] == 1


def test_sft_keeps_the_bar_its_collection_counted_with(store: Store) -> None:
    collected = store.create_run(kind="collect")
    store.update_run(collected.id, summary={"min_reward": 0.7})
    collected = store.get_run(collected.id)
    assert kept_threshold(collected, None) == 0.7 and kept_threshold(collected, 0.2) == 0.2
    assert kept_threshold(store.create_run(kind="train"), None) == 1.0
    asked: list[int] = []
    assert sft_elsewhere(1, lambda n: asked.append(n) or []) is None and asked == []  # one process: this one trains


def test_session_lines_say_what_runs_and_how_to_go_on(store: Store, forge_home: Path) -> None:
    config = ForgeConfig()
    run = store.create_run(config=config.model_dump(mode="json"))
    line = start_line(run.id, config, home=forge_home, resumed=False)
    assert line.startswith(f"run [bold]{run.id}[/]: {config.trainer.steps} step(s)")
    assert f"LoRA r={config.trainer.lora_r}" in line and str(forge_home / "runs" / run.id / "forge.log") in line
    assert start_line(run.id, config, home=forge_home, resumed=True).startswith("resuming")
    store.set_run_status(run.id, "stopped")
    summary = session_summary(store, run.id, forge_home, command="train")
    assert summary.splitlines()[0].startswith(f"run {run.id} stopped: 0 train step(s)")
    assert summary.splitlines()[-1] == f"continue it: forge train --resume {run.id}"


def test_a_harness_asking_for_greedy_sampling_is_warned_about(store: Store) -> None:
    calls = [Call(run_id="r", rollout_id="x", seq=0, request_json={"temperature": 0, "top_p": 0.9}),
             Call(run_id="r", rollout_id="x", seq=1, request_json={"temperature": 0.5})]
    config = ForgeConfig()
    config.proxy.sampling = "harness"
    (warning,) = sampling_warnings(calls, config)
    assert "temperature 0 / 0.5, top_p 0.9" in warning and "GRPO learns nothing" in warning
    config.proxy.sampling = "run"
    assert "training samples by the run's settings instead" in sampling_warnings(calls, config)[0]
    assert sampling_warnings([Call(run_id="r", rollout_id="x", seq=0, request_json={})], config) == []


def test_model_export_refuses_what_it_cannot_write(store: Store, forge_home: Path, tmp_path: Path) -> None:
    run = store.create_run()
    with pytest.raises(ConfigError, match="--format must be one of peft, merged"):
        export_model(store, forge_home, run.id, fmt="gguf", out=tmp_path / "out")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(ForgeError, match="is not an empty folder"):
        export_model(store, forge_home, run.id, fmt="peft", out=tmp_path / "full")
    with pytest.raises(ForgeError, match="has no checkpoint to export"):
        export_model(store, forge_home, run.id, fmt="peft", out=tmp_path / "out")
    store.add_checkpoint(Checkpoint(run_id=run.id, step=3, path=str(tmp_path / "gone"), kind="full"))
    with pytest.raises(ForgeError, match=r"no checkpoint of step 1 \(it has step 3\)"):
        export_model(store, forge_home, run.id, fmt="peft", out=tmp_path / "out", step=1)
    with pytest.raises(ForgeError, match="is gone from"):
        export_model(store, forge_home, run.id, fmt="peft", out=tmp_path / "out")
    (tmp_path / "gone").mkdir()
    with pytest.raises(ForgeError, match="trained all weights, so it has no adapter"):
        export_model(store, forge_home, run.id, fmt="peft", out=tmp_path / "out")
    assert not (tmp_path / "out").exists()

