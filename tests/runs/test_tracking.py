"""[tracking]: train steps logged to the real W&B (offline) and TensorBoard, read back with their own readers."""

from __future__ import annotations

import importlib.util
import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from openforge.config import load_config
from openforge.errors import ConfigError
from openforge.runs.prepare import preflight
from openforge.runs.tracking import check_tracking, open_tracker
from openforge.store import Store, TrainStep
from tests.helpers.analysis import _add, _chat_call, _tool_msg
from tests.helpers.up import home_with_model  # noqa: F401 - the tiny model in FORGE_HOME, as a fixture

NO_WANDB = None if importlib.util.find_spec("wandb") else "wandb is not installed (pip install 'openforge[wandb]')"
NO_TB = None if importlib.util.find_spec("tensorboard") else ("tensorboard is not installed "
                                                              "(pip install 'openforge[tensorboard]')")
NO_MLFLOW = None if importlib.util.find_spec("mlflow") and importlib.util.find_spec("alembic") else (
    "mlflow is not installed (pip install 'openforge[mlflow]')")


def _config(*backends: str, **tracking: Any):
    return load_config(overrides={"name": "tracked", "tracking": {"backends": list(backends), **tracking}})


def _step(store: Store, run_id: str, step: int, rewards: dict[str, list[float]]) -> tuple[dict[str, Any], list[Any]]:
    """Rollouts of `step` with these rewards per task (one answered call each): the metrics train() reports
    and the rollouts it trained, as its `on_step` hands them over."""
    before = {r.id for r in store.list_rollouts(run_id)}
    user = {"role": "user", "content": "what is 2+2?"}
    for task, values in rewards.items():
        for r in values:
            calls = [_chat_call(0, [user], [("bash", {"command": "echo 4"})]),
                     _chat_call(1, [user, _tool_msg("c0-0", "4\n")], text=f"the answer is {int(r * 4)}")]
            _add(store, run_id, task, step, calls, reward=r)
    flat = [r for v in rewards.values() for r in v]
    metrics = {"step": step, "loss": 0.5 - 0.1 * step, "reward_mean": sum(flat) / len(flat), "n_tokens": 100 + step,
               "reward_by_harness": {"mini": 0.25, "codex": 0.75}, "pass_rate": None, "infra_failures": 0}
    return metrics, [r for r in store.list_rollouts(run_id, step=step) if r.id not in before]


def _record(store: Store, run_id: str, metrics: dict[str, Any]) -> None:
    store.add_train_step(TrainStep(run_id=run_id, step=metrics["step"], loss=metrics["loss"]))


def test_an_enabled_backend_that_is_not_installed_is_one_config_error(monkeypatch: pytest.MonkeyPatch,
                                                                       forge_home: Path) -> None:
    import openforge.runs.tracking as tracking

    monkeypatch.setitem(tracking._MODULES, "wandb", ("openforge_no_such_module", "wandb"))
    with pytest.raises(ConfigError, match=r"^tracking.backends names wandb, which is not installed: "
                                          r"pip install 'openforge\[wandb\]'"):
        check_tracking(_config("wandb"))
    with pytest.raises(ConfigError, match="which is not installed"):  # refused before anything starts
        preflight(_config("wandb", samples_per_step=1).model_copy(
            update={"sandbox": load_config(overrides={"sandbox": {"isolation": "none"}}).sandbox}), forge_home)
    check_tracking(_config())  # none named: nothing is imported or checked


def test_an_unknown_backend_is_refused_by_the_config() -> None:
    with pytest.raises(ConfigError, match=r"tracking.backends.0"):
        _config("mlflow-typo")


@pytest.mark.requires("tracking", NO_TB)
def test_tensorboard_steps_read_back_with_event_accumulator(store: Store, forge_home: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = _config("tensorboard", samples_per_step=2)
    run = store.create_run(kind="train", name="tracked", config=config.model_dump(mode="json"))
    tracker = open_tracker(store, run.id, config, home=forge_home)
    for step, rewards in enumerate([{"t1": [0.0, 1.0], "t2": [0.0, 0.0]}, {"t1": [1.0, 1.0], "t2": [0.5, 0.0]}]):
        metrics, rollouts = _step(store, run.id, step, rewards)
        _record(store, run.id, metrics)
        tracker.log_step(metrics, rollouts)
    # the third step is logged, then the process dies before its train-step row: the resume redoes it
    metrics, rollouts = _step(store, run.id, 2, {"t1": [0.0]})
    tracker.log_step({**metrics, "loss": 99.0}, rollouts)
    tracker.close()

    where = Path(store.get_run(run.id).summary_json["tracking"]["tensorboard"]["dir"])
    assert where == forge_home / "runs" / run.id / "tracking" / "tensorboard" / run.id
    resumed = open_tracker(store, run.id, config, home=forge_home)
    metrics, rollouts = _step(store, run.id, 2, {"t1": [1.0]})  # step 2 sampled again: only these trained
    resumed.log_step({**metrics, "loss": 0.3}, rollouts)
    resumed.close()

    acc = EventAccumulator(str(where), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    loss = [(e.step, round(e.value, 6)) for e in acc.Scalars("loss")]
    assert loss == [(0, 0.5), (1, 0.4), (2, 0.3)]  # the redone step once, with its new value
    assert [(e.step, e.value) for e in acc.Scalars("reward_by_task/t1")] == [(0, 0.5), (1, 1.0), (2, 1.0)]
    assert [(e.step, e.value) for e in acc.Scalars("reward_by_task/t2")] == [(0, 0.0), (1, 0.25)]
    assert [e.value for e in acc.Scalars("reward_by_harness/codex")] == [0.75, 0.75, 0.75]
    assert "pass_rate" not in acc.Tags()["scalars"]  # None is no value
    # forge analyze's behaviour metrics, step means: each rollout made 2 answered calls and 1 tool call
    assert [e.value for e in acc.Scalars("behaviour/turns")] == [2.0, 2.0, 2.0]
    assert [e.value for e in acc.Scalars("behaviour/tool_calls")] == [1.0, 1.0, 1.0]
    assert [e.value for e in acc.Scalars("behaviour/tokens_per_turn")] == [10.5, 10.5, 10.5]  # 10 + seq tokens
    texts = {e.step: e.tensor_proto.string_val[0].decode() for e in acc.Tensors("samples/text_summary")}
    assert sorted(texts) == [0, 1, 2]
    assert texts[0].count("\n| t1 |") == 2 and "bash({'command': 'echo 4'}) -> 4" in texts[0]
    assert "answer: the answer is 4" in texts[1]
    [config_text] = acc.Tensors("config/text_summary")
    assert 'name = "tracked"' in config_text.tensor_proto.string_val[0].decode()
    assert "git_commit" in config_text.tensor_proto.string_val[0].decode()


@pytest.mark.requires("tracking", NO_MLFLOW)
def test_mlflow_steps_params_and_samples_read_back_with_its_client(store: Store, forge_home: Path) -> None:
    from mlflow.tracking import MlflowClient

    config = _config("mlflow", samples_per_step=2, project="forge-tests")
    run = store.create_run(kind="train", name="tracked", config=config.model_dump(mode="json"))
    tracker = open_tracker(store, run.id, config, home=forge_home)
    for step, rewards in enumerate([{"t1": [0.0, 1.0]}, {"t1": [1.0], "t2": [0.5]}]):
        metrics, rollouts = _step(store, run.id, step, rewards)
        _record(store, run.id, metrics)
        tracker.log_step(metrics, rollouts)
    tracker.close(failed=True)
    ids = store.get_run(run.id).summary_json["tracking"]["mlflow"]
    assert ids["uri"] == f"sqlite:///{forge_home / 'runs' / run.id / 'tracking' / 'mlflow' / 'mlflow.db'}"
    resumed = open_tracker(store, run.id, config, home=forge_home)  # the same MLflow run continues
    resumed.log_step(*_step(store, run.id, 2, {"t2": [1.0]}))
    resumed.close()

    client = MlflowClient(ids["uri"])
    got = client.get_run(ids["id"])
    assert (got.info.run_name, got.info.status, got.data.tags["forge_run_id"]) == ("tracked", "FINISHED", run.id)
    assert client.get_experiment(got.info.experiment_id).name == "forge-tests"
    assert got.data.params["trainer.steps"] == str(config.trainer.steps) and got.data.params["name"] == "tracked"
    assert [(m.step, m.value) for m in client.get_metric_history(ids["id"], "loss")] == [(0, 0.5), (1, 0.4), (2, 0.3)]
    assert [(m.step, m.value) for m in client.get_metric_history(ids["id"], "reward_by_task/t2")] == [(1, 0.5), (2, 1.0)]
    assert [m.value for m in client.get_metric_history(ids["id"], "behaviour/turns")] == [2.0, 2.0, 2.0]
    arts = {a.path for a in client.list_artifacts(ids["id"])} | {a.path for a in client.list_artifacts(ids["id"], "samples")}
    assert {"config.json", "samples/step_00000.json", "samples/step_00002.json"} <= arts
    table = json.loads(Path(client.download_artifacts(ids["id"], "samples/step_00000.json")).read_text())
    assert table["columns"] == ["task", "sample", "harness", "status", "reward", "transcript"]
    assert [row[4] for row in table["data"]] == [0.0, 1.0]
    assert all(r.info.run_id == ids["id"] for r in client.search_runs([got.info.experiment_id]))  # one run


def _wandb_file(ids: dict[str, Any]) -> Path:
    from tests.helpers import wandb_records

    [path] = Path(ids["dir"]).parent.glob("run-*.wandb")
    return wandb_records.finished(path)


@pytest.mark.requires("tracking", NO_WANDB)
def test_wandb_offline_steps_config_and_samples_read_back(store: Store, forge_home: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.helpers import wandb_records

    monkeypatch.setenv("WANDB_MODE", "offline")
    config = _config("wandb", samples_per_step=3, project="forge-tests")
    run = store.create_run(kind="train", name="tracked", config=config.model_dump(mode="json"))
    tracker = open_tracker(store, run.id, config, home=forge_home)
    for step, rewards in enumerate([{"t1": [0.0, 1.0]}, {"t1": [1.0], "t2": [0.5]}]):
        metrics, rollouts = _step(store, run.id, step, rewards)
        _record(store, run.id, metrics)
        tracker.log_step(metrics, rollouts)
    tracker.close()

    ids = store.get_run(run.id).summary_json["tracking"]["wandb"]
    assert (ids["id"], ids["mode"], ids["project"]) == (run.id, "offline", "forge-tests")
    path = _wandb_file(ids)
    record = wandb_records.run_record(path)
    assert (record.run_id, record.project, record.display_name) == (run.id, "forge-tests", "tracked")
    cfg = wandb_records.config(path)
    assert cfg["forge_run_id"] == run.id and cfg["trainer"]["steps"] == config.trainer.steps
    assert "git_commit" in cfg
    rows = wandb_records.history(path)
    assert [(r["_step"], r["loss"], r["reward_mean"]) for r in rows] == [(0, 0.5, 0.5), (1, 0.4, 0.75)]
    assert rows[1]["reward_by_task/t2"] == 0.5 and rows[0]["reward_by_harness/mini"] == 0.25
    assert rows[0]["samples/_type"] == "table-file" and rows[0]["samples/nrows"] == 2
    table = Path(ids["dir"]) / rows[0]["samples/path"]  # the table file the history row points at
    data = json.loads(table.read_text())
    assert data["columns"] == ["task", "sample", "harness", "status", "reward", "transcript"]
    assert [row[4] for row in data["data"]] == [0.0, 1.0]
    assert "answer: the answer is 4" in data["data"][1][5]

    # resumed: the same W&B run id, stored in the run row
    resumed = open_tracker(store, run.id, config, home=forge_home)
    resumed.log_step(*_step(store, run.id, 2, {"t1": [1.0]}))
    resumed.close()
    files = sorted((forge_home / "runs" / run.id / "tracking" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 2 and {wandb_records.run_record(wandb_records.finished(f)).run_id for f in files} == {run.id}
    assert [r["_step"] for r in wandb_records.history(files[-1])] == [2]


@pytest.mark.requires("tracking", NO_WANDB)
@pytest.mark.parametrize("key, why", [("not-a-key", r"the key was not accepted \(.*API key must have 40\+ characters"),
                                      (None, r"no key configured \(set WANDB_API_KEY")])
def test_a_wrong_or_missing_wandb_key_logs_offline_with_one_warning(
        store: Store, forge_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, key: str | None, why: str) -> None:
    from tests.helpers import wandb_records

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no ~/.config/wandb
    monkeypatch.setenv("NETRC", str(tmp_path / ".netrc"))
    if key is None:
        monkeypatch.delenv("WANDB_API_KEY", raising=False)
    else:
        monkeypatch.setenv("WANDB_API_KEY", key)
    config = _config("wandb")
    run = store.create_run(kind="train", config=config.model_dump(mode="json"))
    with caplog.at_level(logging.WARNING, logger="forge.tracking"):
        tracker = open_tracker(store, run.id, config, home=forge_home)
        tracker.log_step(*_step(store, run.id, 0, {"t1": [1.0]}))
        tracker.close()
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert re.match(f"W&B: {why}", warning) and "logging offline to" in warning and "wandb sync" in warning
    ids = store.get_run(run.id).summary_json["tracking"]["wandb"]
    assert ids["mode"] == "offline"
    assert [r["_step"] for r in wandb_records.history(_wandb_file(ids))] == [0]
    assert not (tmp_path / ".netrc").exists()  # the key is never written anywhere


@pytest.mark.requires("tracking", NO_WANDB)
def test_a_backend_failing_mid_run_is_dropped_with_a_warning(store: Store, forge_home: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    config = _config("wandb")
    run = store.create_run(kind="train", config=config.model_dump(mode="json"))
    tracker = open_tracker(store, run.id, config, home=forge_home)
    tracker.backends["wandb"].run.finish()  # W&B's run ends under the tracker: its next log raises UsageError
    with caplog.at_level(logging.WARNING, logger="forge.tracking"):
        tracker.log_step(*_step(store, run.id, 0, {"t1": [1.0]}))
        tracker.log_step(*_step(store, run.id, 1, {"t1": [1.0]}))
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warning.startswith("tracking: wandb failed (") and "dropped for the rest of the run" in warning
    assert tracker.backends == {}
    tracker.close()


@pytest.mark.slow
@pytest.mark.requires("tracking", NO_WANDB or NO_TB or NO_MLFLOW)
def test_a_run_is_tracked_step_by_step_as_the_store_records_it(home_with_model: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`forge train` with the three trackers: every step's loss and per-task rewards, as the store holds them."""
    from tests.helpers import wandb_records
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tests.helpers.up import SMALL, forge

    monkeypatch.setenv("WANDB_MODE", "offline")  # the child inherits it; CI has no W&B key
    out = forge(home_with_model, *SMALL, "--set", 'tracking.backends=["wandb", "tensorboard", "mlflow"]', "train",
                "--steps", "2", timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    store = Store(home_with_model / "forge.db")
    run = store.get_run("latest")
    steps = store.list_train_steps(run.id)
    assert [s.step for s in steps] == [0, 1]
    by_task: dict[int, dict[str, list[float]]] = {s.step: {} for s in steps}
    for r in store.list_rollouts(run.id):
        by_task[r.step].setdefault(r.task_id, []).append(r.reward)
    tracking = run.summary_json["tracking"]
    acc = EventAccumulator(tracking["tensorboard"]["dir"], size_guidance={"scalars": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(s.step, pytest.approx(s.loss)) for s in steps]
    rows = wandb_records.history(_wandb_file(tracking["wandb"]))
    assert [(r["_step"], r["loss"]) for r in rows] == [(s.step, pytest.approx(s.loss)) for s in steps]
    for row in rows:
        [(task, rewards)] = by_task[row["_step"]].items()  # one task a step (SMALL)
        assert row[f"reward_by_task/{task}"] == pytest.approx(sum(rewards) / len(rewards))
        assert row["samples/nrows"] == 2
    assert tracking["wandb"]["id"] == run.id
    from mlflow.tracking import MlflowClient

    history = MlflowClient(tracking["mlflow"]["uri"]).get_metric_history(tracking["mlflow"]["id"], "loss")
    assert [(m.step, m.value) for m in history] == [(s.step, pytest.approx(s.loss)) for s in steps]


class _Recorder:
    """A tracker backend that keeps what it is sent (the `Backend` protocol; the real ones need their extras)."""

    def __init__(self) -> None:
        self.ids: dict[str, Any] = {}
        self.records: list[Any] = []

    def log(self, record: Any) -> None:
        self.records.append(record)

    def close(self, *, failed: bool) -> None:
        pass


def test_a_step_is_tracked_from_the_rollouts_it_trained_with_the_engine_trainer_mismatch(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from openforge.runs.tracking import Tracker

    run = store.create_run(kind="train", name="tracked")
    store.add_tasks(run.id, [{"id": "t1", "instruction": "add"}, {"id": "t2", "instruction": "add"}])
    # a group that finished before this session (an async resume keeps it) and one sampled now
    _, kept_rollouts = _step(store, run.id, 3, {"t1": [1.0, 1.0]})
    recorder = _Recorder()
    tracker = Tracker(store, run.id, {"rec": recorder}, samples=1)
    metrics, rollouts = _step(store, run.id, 4, {"t2": [0.0, 0.5]})
    _step(store, run.id, 4, {"t2": [1.0]})  # sampled under step 4 but not in the batch it trained
    monkeypatch.setattr(store, "list_rollouts", lambda *a, **k: pytest.fail("the step's rollouts are re-read"))
    tracker.log_step({**metrics, "mismatch_kl": 0.0123, "mismatch_ratio_max": 7.5, "masked_tokens": 2},
                     kept_rollouts + rollouts)
    [record] = recorder.records
    assert record.step == 4
    assert record.scalars["reward_by_task/t1"] == 1.0 and record.scalars["reward_by_task/t2"] == 0.25
    assert (record.scalars["mismatch_kl"], record.scalars["mismatch_ratio_max"], record.scalars["masked_tokens"]) \
        == (0.0123, 7.5, 2.0)
    assert record.scalars["behaviour/turns"] == 2.0
    assert [s["task"] for s in record.samples] == ["t1"]
