"""`forge export`: recorded trajectories as veRL parquet and JSONL, read back and checked."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from openforge.forge_cli.main import app
from openforge.store import Store, Trajectory
from openforge.trainer.export import export_jsonl, iter_records

# A two-turn rollout: prompt (3), model turn (2), tool output (2, masked), model turn (2).
TOKENS = [10, 11, 12, 20, 21, 30, 31, 40, 41]
MASK = [0, 0, 0, 1, 1, 0, 0, 1, 1]
LOGP = [0.0, 0.0, 0.0, -0.5, -0.25, 0.0, 0.0, -1.0, -2.0]


def _run(store: Store) -> str:
    run = store.create_run(name="export")
    store.add_tasks(run.id, [{"id": "count", "instruction": "count the lines"}])
    good = store.create_rollout(run_id=run.id, task_id="count", step=3, sample_index=1, harness="mini")
    store.replace_trajectories(good.id, [
        Trajectory(run_id=run.id, rollout_id=good.id, segment=s, token_ids=TOKENS,
                   loss_mask=MASK, logprobs=LOGP) for s in (0, 1)])
    store.update_rollout(good.id, status="scored", reward=0.75)
    bad = store.create_rollout(run_id=run.id, task_id="count", step=3)
    store.replace_trajectories(bad.id, [Trajectory(run_id=run.id, rollout_id=bad.id, token_ids=[1, 2],
                                                   loss_mask=[0, 1], logprobs=[0.0, -1.0])])
    store.update_rollout(bad.id, status="failed", error="sandbox died")
    return run.id


def test_records_split_prompt_and_response_and_skip_failed_rollouts(store: Store) -> None:
    run_id = _run(store)
    recs = list(iter_records(store, run_id))
    assert [r["segment"] for r in recs] == [0, 1]
    r = recs[0]
    assert r["prompt_ids"] == [10, 11, 12] and r["response_ids"] == TOKENS[3:]
    assert r["response_mask"] == MASK[3:] and r["rollout_log_probs"] == LOGP[3:]
    assert r["token_level_scores"] == [0, 0, 0, 0, 0, 0.75]  # on the last sampled token
    assert r["reward"] == 0.75 and r["uid"] == "count@3" and r["instruction"] == "count the lines"


def test_cli_writes_verl_parquet_and_jsonl(store: Store, tmp_path: Path) -> None:
    run_id = _run(store)
    runner = CliRunner()
    res = runner.invoke(app, ["export", run_id, "--format", "verl", "--out", str(tmp_path / "t.parquet")])
    assert res.exit_code == 0, res.output
    assert "wrote 2 trajectory segment(s)" in res.output
    table = pq.read_table(tmp_path / "t.parquet")
    for col in ("data_source", "prompt", "ability", "reward_model", "extra_info", "uid", "prompts", "responses",
                "response_mask", "rollout_log_probs", "token_level_scores", "reward"):
        assert col in table.column_names
    row = table.to_pylist()[0]
    assert row["prompt"] == [{"role": "user", "content": "count the lines"}]
    assert row["prompts"] == [10, 11, 12] and row["response_mask"] == MASK[3:]
    assert row["rollout_log_probs"] == pytest.approx(LOGP[3:])
    assert row["extra_info"]["task_id"] == "count" and row["extra_info"]["step"] == 3

    res = runner.invoke(app, ["export", run_id[:12], "--out", str(tmp_path / "t.jsonl")])
    assert res.exit_code == 0, res.output
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["segment"] == 1
    assert export_jsonl(store, run_id, tmp_path / "again.jsonl") == 2


def test_cli_export_errors_are_one_line(store: Store, tmp_path: Path) -> None:
    run_id = _run(store)
    runner = CliRunner()
    for args, msg in ((["--format", "csv", "--out", str(tmp_path / "x")], "--format must be one of"),
                      (["--out", str(tmp_path / "no" / "x.jsonl")], "does not exist"),
                      (["--out", str(tmp_path)], "is a directory")):
        res = runner.invoke(app, ["export", run_id, *args])
        assert res.exit_code == 1 and msg in res.output and "Traceback" not in res.output
    res = runner.invoke(app, ["export", "run-nope", "--out", str(tmp_path / "x.jsonl")])
    assert res.exit_code == 1 and "no run" in res.output


def test_cli_train_refuses_changed_flags_on_resume(store: Store) -> None:
    res = CliRunner().invoke(app, ["train", "--resume", "latest", "--lr", "0.1"])
    assert res.exit_code == 1 and "only --steps may change" in res.output
