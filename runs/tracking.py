"""Experiment tracking: a training run's steps logged to W&B, TensorBoard and MLflow beside the run store.

    check_tracking(config)                                   # preflight: every named backend importable
    tracker = open_tracker(store, run_id, config, home=home) # after the run row exists (new or resumed)
    tracker.log_step(metrics, rollouts)                      # each train step (runs/train.py's step_done)
    tracker.close(failed=False)

Each step logs its scalars (loss, rewards, KL, the engine/trainer mismatch, timings, ...), the
per-harness rewards the step metrics carry (`reward_by_harness/<name>`), the per-task mean rewards of
the rollouts the step trained (`reward_by_task/<task>`, from the rollouts the loop hands over; only their
calls are read from the store, for the transcripts) and a small table of transcripts (the step's first
`tracking.samples_per_step` rollouts). The config and the git commit of forge's source go in once.

The tracked run's ids live in the run row (`run.summary_json["tracking"]`): a resumed run continues
the same W&B run (`resume="allow"` on the stored id), the same MLflow run and the same TensorBoard
folder, whose events past the steps already recorded are purged. A backend that fails mid-run is dropped with one warning;
the run goes on, and the store holds every step anyway.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import statistics
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from openforge.config import ForgeConfig, TrackingConfig
from openforge.errors import ConfigError
from openforge.paths import runs_dir
from openforge.store import Store

log = logging.getLogger("forge.tracking")

# backend -> (the module it imports, the extra that installs it)
_MODULES = {"wandb": ("wandb", "wandb"), "tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow")}
_TRANSCRIPT_CHARS = 4000  # of one sample's transcript: a table cell, not the whole rollout (`forge show`)


def check_tracking(config: ForgeConfig) -> None:
    """ConfigError, with the install command, for a backend `tracking.backends` names that is not installed."""
    for name in config.tracking.backends:
        module, extra = _MODULES[name]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"tracking.backends names {name}, which is not installed: "
                              f"pip install 'openforge[{extra}]' (or remove it from [tracking])")


@dataclass
class StepRecord:
    """What one train step sends to every tracker."""

    step: int
    scalars: dict[str, float]
    samples: list[dict[str, Any]] = field(default_factory=list)


class Backend(Protocol):
    """One tracker: opened by its constructor, then a record a step, then closed."""

    ids: dict[str, Any]  # what a resume needs to continue this tracked run (stored in the run row)

    def log(self, record: StepRecord) -> None: ...

    def close(self, *, failed: bool) -> None: ...


SAMPLE_COLUMNS = ("task", "sample", "harness", "status", "reward", "transcript")
# forge analyze's per-rollout metrics (rollouts/analysis/behaviour.py), logged as step means
BEHAVIOUR_METRICS = ("turns", "tool_calls", "tool_coverage", "self_verified", "error_recovery", "plan_completion",
                     "gave_up", "prefix_breaks", "tokens_per_turn")


def step_record(store: Store, metrics: dict[str, Any], rollouts: Sequence[Any], *, samples: int,
                tasks: dict[str, dict[str, Any]]) -> StepRecord:
    """The step's scalars (nested dicts flattened to `outer/inner`), the per-task rewards of the rollouts
    it trained, `forge analyze`'s behaviour metrics as step means, and up to `samples` transcripts.
    `tasks`: the run's task specs by id (read once per run)."""
    from openforge.rollouts.runner.transcript import transcript_of

    step = int(metrics["step"])
    scalars: dict[str, float] = {}
    for key, value in metrics.items():
        if key == "step":
            continue
        if isinstance(value, dict):
            scalars.update({f"{key}/{k}": float(v) for k, v in value.items() if _is_number(v)})
        elif _is_number(value):
            scalars[key] = float(value)
    rollouts = sorted(rollouts, key=lambda r: (r.task_id, r.sample_index))
    by_task: dict[str, list[float]] = {}
    for r in rollouts:
        if r.reward is not None:
            by_task.setdefault(r.task_id, []).append(r.reward)
    scalars.update({f"reward_by_task/{task}": statistics.fmean(v) for task, v in by_task.items()})
    transcripts = {r.id: transcript_of(store.list_calls(rollout_id=r.id)) for r in rollouts}
    scalars.update(_behaviour(rollouts, transcripts, tasks))
    return StepRecord(step=step, scalars=scalars,
                      samples=[_sample(r, transcripts[r.id]) for r in rollouts[:samples]])


def _behaviour(rollouts: Sequence[Any], transcripts: dict[str, Any], tasks: dict[str, dict[str, Any]]
               ) -> dict[str, float]:
    """`behaviour/<metric>`: the means of `forge analyze`'s behaviour metrics over the step's sampled rollouts
    (scored or timed out: the policy's own outcomes), each over the rollouts it applies to."""
    from openforge.rollouts.analysis.behaviour import behaviour_of
    from openforge.rollouts.runner.metrics import DATA_STATES

    rows = [behaviour_of(r, transcripts[r.id], tasks.get(r.task_id, {})) for r in rollouts if r.status in DATA_STATES]
    out: dict[str, float] = {}
    for metric in BEHAVIOUR_METRICS:
        values = [float(v) for b in rows if (v := getattr(b, metric)) is not None]
        if values:
            out[f"behaviour/{metric}"] = statistics.fmean(values)
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _sample(rollout: Any, t: Any) -> dict[str, Any]:
    lines = [f"{s.name}({_short(s.arguments)}) -> {_short(s.result) if s.result is not None else '(no result)'}"
             for s in t.steps]
    if t.final_text is not None:
        lines.append(f"answer: {t.final_text}")
    if rollout.error:
        lines.append(f"{rollout.failure_kind or 'error'}: {rollout.error}")
    text = "\n".join(lines) or "(no model calls)"
    return {"task": rollout.task_id, "sample": rollout.sample_index, "harness": rollout.harness,
            "status": rollout.status, "reward": rollout.reward, "transcript": text[:_TRANSCRIPT_CHARS]}


def _short(value: Any, n: int = 300) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= n else text[:n] + "..."


def git_commit() -> str | None:
    """The commit of forge's own source tree (with `-dirty` when it has local changes); None outside git."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("-dirty" if dirty else "")


# ---------------------------------------------------------------------------------------------
# The backends. Each imports its library when it is opened, never at forge's start.


class TensorBoardBackend:
    """Event files under `<dir>/tensorboard/<run id>` (torch.utils.tensorboard's SummaryWriter)."""

    def __init__(self, cfg: TrackingConfig, run_id: str, *, where: Path, config: dict[str, Any],
                 resume_from: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.dir = where / "tensorboard" / run_id
        # purge_step: a resumed run's events from a step at or past the first one it redoes are dropped
        # by TensorBoard's readers, so a curve never doubles back.
        self.writer = SummaryWriter(log_dir=str(self.dir), purge_step=resume_from)
        self.ids = {"dir": str(self.dir)}
        if resume_from is None:
            self.writer.add_text("config", "```\n" + _toml(config) + "\n```", 0)

    def log(self, record: StepRecord) -> None:
        for key, value in record.scalars.items():
            self.writer.add_scalar(key, value, record.step)
        if record.samples:
            self.writer.add_text("samples", _markdown_table(record.samples), record.step)
        self.writer.flush()

    def close(self, *, failed: bool) -> None:
        self.writer.close()


class WandbBackend:
    """A W&B run whose id is stored in the run row: online when a key is configured and accepted, else
    offline under `<dir>/wandb` (`wandb sync` uploads it later), with one warning saying so."""

    def __init__(self, cfg: TrackingConfig, run_id: str, *, where: Path, config: dict[str, Any],
                 name: str, wandb_id: str | None) -> None:
        import wandb

        where.mkdir(parents=True, exist_ok=True)
        mode, why = _wandb_mode(cfg)
        if why:
            log.warning("W&B: %s; logging offline to %s (upload it later with `wandb sync`)", why, where / "wandb")
        kwargs = dict(project=cfg.project, name=name, id=wandb_id or run_id, resume="allow", dir=str(where),
                      config=config, reinit="create_new",
                      # the dashboard owns the terminal: W&B neither captures nor prints to it
                      settings=wandb.Settings(console="off", silent=True))
        try:
            self.run = wandb.init(mode=mode, **kwargs)
        except Exception as exc:  # noqa: BLE001 - an online start that fails (network, server) goes offline
            if mode == "offline":
                raise
            log.warning("W&B: could not start online (%s); logging offline to %s (upload it later with "
                        "`wandb sync`)", _first_line(exc), where / "wandb")
            self.run = wandb.init(mode="offline", **kwargs)
        self.ids = {"id": self.run.id, "project": cfg.project, "mode": mode, "dir": str(self.run.dir)}
        self._wandb = wandb

    def log(self, record: StepRecord) -> None:
        data: dict[str, Any] = dict(record.scalars)
        if record.samples:
            rows = [[s[c] for c in SAMPLE_COLUMNS] for s in record.samples]
            data["samples"] = self._wandb.Table(columns=list(SAMPLE_COLUMNS), data=rows)
        self.run.log(data, step=record.step)

    def close(self, *, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)
        # finish() returns before W&B's core has flushed the run file; teardown waits for it (and the
        # next run in this process reads its key afresh rather than from a cached session)
        self._wandb.teardown()


class MlflowBackend:
    """An MLflow run (MlflowClient, no global active run): its id stored in the run row, so a resume
    logs on into it. Without `tracking.mlflow_uri`, a SQLite store in `<dir>/mlflow/mlflow.db` and its
    artifacts (the config, each step's samples table) under `<dir>/mlflow/artifacts`."""

    def __init__(self, cfg: TrackingConfig, run_id: str, *, where: Path, config: dict[str, Any], name: str,
                 mlflow_id: str | None) -> None:
        from mlflow.tracking import MlflowClient

        home = where / "mlflow"
        home.mkdir(parents=True, exist_ok=True)
        uri = cfg.mlflow_uri or f"sqlite:///{home / 'mlflow.db'}"
        self.client = client = MlflowClient(uri)
        if mlflow_id:
            self.id = mlflow_id
            client.update_run(mlflow_id, status="RUNNING")
        else:
            found = client.get_experiment_by_name(cfg.project)
            experiment = found.experiment_id if found else client.create_experiment(
                cfg.project, artifact_location=None if cfg.mlflow_uri else (home / "artifacts").as_uri())
            run = client.create_run(experiment, run_name=name, tags={"forge_run_id": run_id,
                                                                     "git_commit": str(config.get("git_commit"))})
            self.id = run.info.run_id
            client.log_dict(self.id, config, "config.json")
            self._log_params(config)
        self.ids = {"id": self.id, "uri": uri, "dir": str(home)}

    def _log_params(self, config: dict[str, Any]) -> None:
        """The config as params (`trainer.lr`, ...), which MLflow's run table compares across runs."""
        from mlflow.entities import Param

        flat = [Param(k, str(v)[:500]) for k, v in _flatten(config).items()]
        for i in range(0, len(flat), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(self.id, params=flat[i:i + 100])

    def log(self, record: StepRecord) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(_mlflow_key(k), v, now, record.step) for k, v in record.scalars.items()]
        for i in range(0, len(metrics), 1000):  # at most 1000 metrics a batch
            self.client.log_batch(self.id, metrics=metrics[i:i + 1000])
        if record.samples:
            columns = {c: [s[c] for s in record.samples] for c in SAMPLE_COLUMNS}
            self.client.log_table(self.id, data=columns, artifact_file=f"samples/step_{record.step:05d}.json")

    def close(self, *, failed: bool) -> None:
        self.client.set_terminated(self.id, status="FAILED" if failed else "FINISHED")


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        elif value is not None:
            out[f"{prefix}{key}"] = value
    return out


def _mlflow_key(key: str) -> str:
    """MLflow's metric names allow letters, digits, _ - . / and spaces: a task id with other characters
    has them replaced by _."""
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in key)


def _wandb_mode(cfg: TrackingConfig) -> tuple[str, str | None]:
    """("online" | "offline", why it is offline when the user may have wanted online, else None)."""
    import wandb

    if os.environ.get("WANDB_MODE", "").lower() in ("offline", "dryrun", "disabled") or cfg.wandb_mode == "offline":
        return "offline", None
    try:
        # The key from WANDB_API_KEY or ~/.netrc, checked with the server; never prompts, never written anywhere.
        logged_in = wandb.login(verify=True, prompt=False)
    except Exception as exc:  # noqa: BLE001 - AuthenticationError, a malformed key, no network
        return "offline", f"the key was not accepted ({_first_line(exc)})"
    if not logged_in:
        return "offline", "no key configured (set WANDB_API_KEY or run `wandb login`)"
    return "online", None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def _toml(config: dict[str, Any]) -> str:
    import tomli_w

    def drop_none(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: drop_none(v) for k, v in value.items() if v is not None}
        return value

    return tomli_w.dumps(drop_none(config))


def _markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(SAMPLE_COLUMNS) + " |", "|" + "---|" * len(SAMPLE_COLUMNS)]
    lines += ["| " + " | ".join(cell(r[c]) for c in SAMPLE_COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The fan-out the run uses.


class Tracker:
    """Every configured backend; one that raises is dropped with a warning, never failing the run."""

    def __init__(self, store: Store, run_id: str, backends: dict[str, Backend], *, samples: int) -> None:
        self.store, self.run_id, self.backends, self.samples = store, run_id, backends, samples
        self._tasks: dict[str, dict[str, Any]] | None = None  # the run's task specs: fixed once it trains

    def log_step(self, metrics: dict[str, Any], rollouts: Sequence[Any]) -> None:
        """Log a step from its metrics and the rollouts it trained (trainer/loop.py's `on_step`)."""
        if not self.backends:
            return
        try:
            if self._tasks is None:
                self._tasks = {t.task_id: (t.spec_json or {}) for t in self.store.list_tasks(self.run_id)}
            record = step_record(self.store, metrics, rollouts, samples=self.samples, tasks=self._tasks)
        except Exception as exc:  # noqa: BLE001 - the store is the record; the trackers are a copy
            log.warning("tracking: step %s not logged: %s", metrics.get("step"), _first_line(exc))
            return
        for name, backend in list(self.backends.items()):
            try:
                backend.log(record)
            except Exception as exc:  # noqa: BLE001
                log.warning("tracking: %s failed (%s); it is dropped for the rest of the run", name, _first_line(exc))
                self.backends.pop(name)

    def close(self, *, failed: bool = False) -> None:
        for name, backend in self.backends.items():
            try:
                backend.close(failed=failed)
            except Exception as exc:  # noqa: BLE001
                log.warning("tracking: closing %s failed: %s", name, _first_line(exc))
        self.backends = {}


def open_tracker(store: Store, run_id: str, config: ForgeConfig, *, home: Path) -> Tracker:
    """The run's trackers, continuing the tracked runs stored in its row when it has done steps before.
    A backend that cannot start is left out with a warning (preflight has checked it is installed);
    this never raises: the run trains without trackers rather than not at all."""
    if not config.tracking.backends:
        return Tracker(store, run_id, {}, samples=0)
    try:
        return _open_backends(store, run_id, config, home=home)
    except Exception as exc:  # noqa: BLE001
        log.warning("tracking: not started (%s); the run goes on without it", _first_line(exc))
        return Tracker(store, run_id, {}, samples=0)


def _open_backends(store: Store, run_id: str, config: ForgeConfig, *, home: Path) -> Tracker:
    cfg = config.tracking
    run = store.get_run(run_id)
    stored = dict((run.summary_json or {}).get("tracking") or {})
    done = store.list_train_steps(run_id)
    resume_from = max(s.step for s in done) + 1 if done else None
    where = Path(cfg.dir).expanduser() if cfg.dir else runs_dir(home) / run_id / "tracking"
    logged = {**config.model_dump(mode="json"), "forge_run_id": run_id, "git_commit": git_commit()}
    backends: dict[str, Backend] = {}
    for name in cfg.backends:
        try:
            if name == "tensorboard":
                backends[name] = TensorBoardBackend(cfg, run_id, where=where, config=logged, resume_from=resume_from)
            elif name == "mlflow":
                backends[name] = MlflowBackend(cfg, run_id, where=where, config=logged,
                                               name=cfg.run_name or config.name or run_id,
                                               mlflow_id=(stored.get("mlflow") or {}).get("id"))
            else:
                backends[name] = WandbBackend(cfg, run_id, where=where, config=logged,
                                              name=cfg.run_name or config.name or run_id,
                                              wandb_id=(stored.get("wandb") or {}).get("id"))
        except Exception as exc:  # noqa: BLE001 - the run trains without it
            log.warning("tracking: %s could not start (%s); the run goes on without it", name, _first_line(exc))
    if backends:
        stored.update({name: b.ids for name, b in backends.items()})
        store.update_run(run_id, summary={**(run.summary_json or {}), "tracking": stored})
        log.info("tracking to %s", ", ".join(f"{n} ({b.ids.get('dir')})" for n, b in backends.items()))
    return Tracker(store, run_id, backends, samples=cfg.samples_per_step)
