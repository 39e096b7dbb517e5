"""One training session, the same for `forge up` (the dashboard) and `forge train` (headless):

    code = run_session(request, home=home, open_store=st.store, rank_argv=argv_for, front_end=show, say=print)

in a fixed order: a torchrun rank other than 0 follows rank 0; with trainer.nproc > 1 the command runs
again on that many ranks (`rank_argv(n)` is the invocation to repeat); runs whose process died are
marked interrupted; the config is preflighted (a resumed run's *stored* config, the one it will run
with); the run row is made or reopened; the front end drives it; the summary is said. A failed run
raises ForgeError after its summary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from openforge.config import ForgeConfig, stored_config
from openforge.errors import ConfigError, ForgeError
from openforge.paths import runs_dir
from openforge.readmodel import read_run_report
from openforge.runs.control import RunController
from openforge.runs.prepare import mark_dead_runs, preflight, prepare_run
from openforge.runs.train import Outcome
from openforge.store import Store

# The front end that drives the run to its end: the dashboard or headless progress (forge_cli/up_views.py).
FrontEnd = Callable[[Store, str, ForgeConfig, RunController, bool], Outcome]


@dataclass(frozen=True)
class SessionRequest:
    """What one `forge up` / `forge train` invocation asks for."""

    command: str  # "up" or "train": the command the printed hints name
    config: ForgeConfig  # this invocation's effective config; a resumed run runs with its stored one
    resume: str | None = None  # the run to continue (id, unique prefix or 'latest')
    steps: int | None = None  # with `resume`: the run's new total of steps
    nproc: int | None = None  # --nproc; else the resumed run's, else trainer.nproc


def run_session(request: SessionRequest, *, home: Path, open_store: Callable[[], Store],
                rank_argv: Callable[[int], list[str]], front_end: FrontEnd, say: Callable[[str], object]) -> int:
    """Run one session to its end; return the exit status (non-zero: the torchrun ranks' own)."""
    from openforge.trainer import launch

    if launch.is_follower():  # a torchrun rank other than 0: rank 0 owns the run and drives this one
        launch.follow()
        return 0
    procs = request.nproc or _stored_nproc(open_store, request.resume) or request.config.trainer.nproc
    if procs > 1 and not launch.under_torchrun():  # the same command on `procs` ranks; rank 0 is the run
        return launch.relaunch(procs, rank_argv(procs))
    store = open_store()
    for run_id in mark_dead_runs(store):
        say(f"[magenta]{run_id}[/] was left running by a process that is gone: marked interrupted "
            f"(continue it with `forge {request.command} --resume {run_id}`)")
    config = request.config
    if request.resume is not None:
        stored = store.get_run(request.resume).config_json
        config = stored_config(stored) if stored else config
    if config.engine.kind == "remote":
        raise ConfigError("engine.kind = \"remote\" is a teacher's endpoint: it records calls (forge eval, forge proxy) "
                          f"for forge sft, and has no weights forge {request.command} could train; use an engine "
                          "forge can load adapters into (embedded, sglang, url or router)")
    preflight(config, home)  # before the run row is touched: a refusal leaves a resumable run as it was
    run_id, config = prepare_run(store, config, home=home, resume=request.resume, steps=request.steps)
    say(start_line(run_id, config, home=home, resumed=request.resume is not None))
    outcome = front_end(store, run_id, config, RunController(store, run_id), request.resume is not None)
    say(session_summary(store, run_id, home, command=request.command))
    if outcome.status == "failed":
        raise ForgeError(f"run {run_id} failed: {outcome.error}")
    return 0


def _stored_nproc(open_store: Callable[[], Store], resume: str | None) -> int | None:
    """A resumed run's trainer.nproc, from its stored config."""
    if resume is None:
        return None
    stored = open_store().get_run(resume).config_json or {}
    return int(stored.get("trainer", {}).get("nproc", 1))


def start_line(run_id: str, config: ForgeConfig, *, home: Path, resumed: bool) -> str:
    """What the session is about to do, in one line."""
    t = config.trainer
    weights = "full" if t.full_finetune else f"LoRA r={t.lora_r}"
    return (f"{'resuming' if resumed else 'run'} [bold]{run_id}[/]: {t.steps} step(s) x {t.tasks_per_step} task(s) "
            f"x {config.runner.samples_per_task} rollouts, {weights}, lr {t.lr:g}; {', '.join(config.harness.weights())} on "
            f"{config.tasks.path} in {config.sandbox.type} sandboxes, engine {config.engine.kind}; "
            f"log {runs_dir(home) / run_id / 'forge.log'}")


def session_summary(store: Store, run_id: str, home: Path, *, command: str = "up") -> str:
    """Where the run is stored and what it did, in a few lines (the last thing a session prints)."""
    report = read_run_report(store, run_id)
    run = report.run
    loaded = [c for c in store.list_checkpoints(run_id) if c.loaded]
    mean = f", mean reward {report.mean_scored_reward:.3f}" if report.n_scored else ""
    lines = [
        f"run {run.id} {run.status}: {len(report.steps)} train step(s), {report.n_scored}/{report.n_rollouts} "
        f"rollouts scored{mean}, {len(loaded)} adapter(s) hot-loaded; serving {run.current_adapter or 'the base model'}",
        f"stored in {store.where} (artefacts in {runs_dir(home) / run.id})",
        f"look at it: forge show {run.id}  |  forge dash {run.id}  |  forge calls {run.id}",
    ]
    if run.status in ("stopped", "interrupted", "failed") and len(report.steps) < stored_config(
            run.config_json or {}).trainer.steps:
        lines.append(f"continue it: forge {command} --resume {run.id}")
    if run.error:
        lines.insert(1, f"error: {run.error}")
    return "\n".join(lines)
