"""Before a run starts anything: the model, what this machine can do (`preflight`), and the run row
(new, or reopened with `--resume`). Everything here is quick and refuses with the fix."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from openforge.config import ForgeConfig, stored_config
from openforge.errors import ConfigError, EngineError, ForgeError, HarnessError, NotFoundError
from openforge.paths import default_tiny_model, default_tiny_vl_model
from openforge.store import RUN_FINAL, Store

log = logging.getLogger("forge.run")


def pid_alive(pid: int) -> bool:
    """Whether a run's owner still lives (a zombie - killed, not yet reaped - does not)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # alive, owned by someone else
        return True


def resolve_model(config: ForgeConfig, home: Path) -> Path:
    """The model folder the engine and the trainer load; the tiny model is built when it is the default."""
    if config.engine.kind == "url" and not config.engine.model:
        raise ConfigError("engine.kind = \"url\" needs engine.model: the local copy of the served checkpoint "
                          "(the trainer and the proxy's tokenizer load it)")
    from openforge.rollouts.harnesses import harness_class

    gui = any(harness_class(name).gui for name in config.harness.weights())
    if not config.engine.model and gui:  # a harness sends screenshots: a vision model
        return _tiny_vl_model(home)
    path = Path(config.engine.model).expanduser() if config.engine.model else default_tiny_model(home)
    if not config.engine.model:
        _warm_tiny_model(path)
    if not (path / "config.json").is_file():
        raise ConfigError(f"engine.model {path} is not a model folder (no config.json); "
                          "point it at a Hugging Face checkpoint directory, or leave it empty for the tiny model")
    return path


def _warm_tiny_model(path: Path) -> None:
    """Build the tiny model at `path` and warm it up when there is none, or when forge's own warm-up of
    it predates today's demo questions (it would answer them blind). A model someone put there without
    a warm-up record is theirs and stays. Built beside and renamed into place, so an interrupted build
    never leaves a half-trained model where the next run would take it."""
    from openforge.trainer.warmup.text import WARMUP_FILE, is_warmed_up

    if (path / "config.json").is_file() and (is_warmed_up(path) or not (path / WARMUP_FILE).exists()):
        return
    if path.is_symlink():
        raise ConfigError(f"{path} links to a model warmed up for an older demo; remove the link to rebuild it")
    from openforge.engine.tiny import LEARNABLE_NORM_GAIN, build_tiny_model
    from openforge.trainer.warmup.text import warm_up_number_answers

    log.info("building the tiny model in %s (and a few seconds' warm-up)", path)
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    build_tiny_model(tmp, norm_gain=LEARNABLE_NORM_GAIN)  # peaked, so GRPO can visibly move it
    # Exact grading gives a random model no right answer to reinforce: teach it the answer format
    # (one digit, any digit) first, so the demo's groups hold some right answers (trainer/warmup/text.py).
    warm_up_number_answers(tmp)
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)


def _tiny_vl_model(home: Path) -> Path:
    """The tiny VLM for a GUI harness with no model configured: built, then taught the answer format
    of the gui-colour demo (trainer/warmup/gui.py), once per FORGE_HOME."""
    from openforge.trainer.warmup.gui import is_warmed_up

    path = default_tiny_vl_model(home)
    if not (path / "config.json").is_file() or not is_warmed_up(path):  # none yet, or an older warm-up's
        from openforge.engine.tiny import LEARNABLE_NORM_GAIN
        from openforge.engine.tiny_vl import build_tiny_vl_model
        from openforge.trainer.warmup.gui import warm_up_gui_answers

        log.info("building the tiny vision-language model in %s (and a ~1 minute warm-up)", path)
        tmp = path.with_name(path.name + ".partial")  # a model dir appears only once warmed up
        shutil.rmtree(tmp, ignore_errors=True)
        build_tiny_vl_model(tmp, norm_gain=LEARNABLE_NORM_GAIN)
        warm_up_gui_answers(tmp)
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)
    return path


def preflight(config: ForgeConfig, home: Path) -> None:
    """Refuse early, with the fix, when the config asks for something this machine lacks."""
    for _, check in preflight_checks(config):
        check()


def preflight_checks(config: ForgeConfig) -> list[tuple[str, Callable[[], object]]]:
    """Preflight's checks in order, each a name and a call that raises ForgeError with the fix:
    `preflight` stops at the first refusal, `forge up --dry-run` (runs/plan.py) runs them all."""
    from openforge.runs.tracking import check_tracking

    checks = config.sandbox.preflight_checks()  # its engine or cluster answers (each backend's config says what)
    if config.engine.kind == "sglang":
        checks.append(("SGLang", lambda: _check_sglang(config)))
    if config.engine.kind == "url" and not config.engine.url:
        checks.append(("engine", lambda: _refuse(ConfigError("engine.kind = \"url\" needs engine.url "
                                                             "(e.g. http://gpu-box:30000)"))))
    if config.engine.kind == "remote":
        from openforge.proxy.teacher import check_teacher_config

        checks.append(("teacher", lambda: check_teacher_config(config.engine)))  # type: ignore[arg-type]
    checks += [("harness", lambda: check_harness(config)), ("tracking", lambda: check_tracking(config)),
               ("isolation", lambda: isolation_for(config))]
    return checks


def _refuse(exc: ForgeError) -> None:
    raise exc


def _check_sglang(config: ForgeConfig) -> None:
    from openforge.runs.checks import check_sglang

    check = check_sglang(config)
    if check.verdict != "ok":
        raise EngineError(f"SGLang is {check.detail}; or use engine.kind = \"embedded\" "
                          "(CPU) or \"url\" for a server that is already running")


def check_harness(config: ForgeConfig) -> None:
    """HarnessError, with the fix, when a configured harness (each of `harness.names`) cannot run with
    the configured sandbox (unknown; not installed in the npm cache for local sandboxes; container
    images are checked as they start). Every problem at once, one line each."""
    from openforge.rollouts.harnesses import harness_available

    fixes = [fix for name in config.harness.weights()
             if (fix := harness_available(config.model_copy(update={"harness": config.harness.one(name)})))]
    if fixes:
        raise HarnessError("; ".join(fixes))


def isolation_for(config: ForgeConfig) -> str:
    """What keeps this run's rollouts in (recorded as `run.isolation`): bwrap-userns, docker, kubernetes
    or none. Local sandboxes without a working bubblewrap are refused (`IsolationUnavailable`, with the
    fix) unless the user chose `sandbox.isolation = "none"`: the policy's code must never run on the
    host by accident."""
    from openforge.sandbox.factory import isolation_check

    return isolation_check(config.sandbox).name


def load_run_tasks(config: ForgeConfig) -> list[Any]:
    from openforge.rollouts.tasks.format import load_tasks
    from openforge.rollouts.tasks.setup_files import SetupLimits

    from openforge.rollouts.tasks.kinds import check_run

    tasks = load_tasks(config.tasks.path, include=config.tasks.include or None, limits=SetupLimits.of(config.tasks))
    if not tasks:
        raise ConfigError(f"the task set {config.tasks.path} is empty")
    check_run(tasks, config)  # a family's refusal (online-only tasks) before any engine starts
    return tasks


def mark_dead_runs(store: Store) -> list[str]:
    """Runs whose driving process died (SIGKILL, a crash, a reboot) become `interrupted`."""
    return store.mark_interrupted(alive=pid_alive)


def resolve_init_from(store: Store | None, config: ForgeConfig, home: Path) -> ForgeConfig:
    """trainer.init_from as the absolute path of a checked adapter folder (what the run stores, so a
    resume starts from the same one): a folder as given, or a run's (id, prefix, 'latest') final adapter.
    `store` None: there is no store yet, so no run to start from (`forge up --dry-run` creates none)."""
    from openforge.trainer.checkpoint import final_adapter
    from openforge.trainer.model import check_init_adapter
    from openforge.trainer.vision import is_vision_model

    value = config.trainer.init_from
    if not value:
        return config
    path: Path | None = Path(value).expanduser()
    if not path.exists():
        try:
            if store is None:
                raise NotFoundError(value)
            run = store.get_run(value)
        except NotFoundError:
            raise ConfigError(f"--init-from {value}: neither an adapter folder nor a run (see `forge runs`)") from None
        path = final_adapter(home, run.id)
        if path is None:
            raise ConfigError(f"--init-from {value}: run {run.id} (kind {run.kind}, {run.status}) saved no LoRA adapter")
    vision = bool(config.engine.model) and is_vision_model(config.engine.model)  # unset: the tiny text model
    path = check_init_adapter(path.resolve(), config.trainer, vision=vision)
    return config.model_copy(update={"trainer": config.trainer.model_copy(update={"init_from": str(path)})})


def prepare_run(store: Store, config: ForgeConfig, *, home: Path, resume: str | None = None,
                steps: int | None = None) -> tuple[str, ForgeConfig]:
    """Create the run (or reopen `resume` with its stored config) and copy its tasks in.

    Returns the run id and the effective config, whose `engine.model` is the resolved model folder."""
    if resume is None:
        model = resolve_model(config, home)
        config = config.model_copy(update={"engine": config.engine.model_copy(update={"model": str(model)})})
        config = resolve_init_from(store, config, home)
        tasks = load_run_tasks(config)
        run = store.create_run(kind="train", name=config.name, config=config.model_dump(mode="json"),
                               owner_pid=os.getpid())
        store.add_tasks(run.id, [t.to_record() for t in tasks])
        store.update_run(run.id, isolation=isolation_for(config))
        return run.id, config
    run = store.get_run(resume)
    if run.status not in RUN_FINAL:
        raise ForgeError(f"run {run.id} is {run.status} (driven by pid {run.owner_pid}); "
                         f"stop it first with `forge stop {run.id}`")
    config = stored_config(run.config_json) if run.config_json else config
    if steps is not None:
        config.trainer.steps = steps
    done = len(store.list_train_steps(run.id))
    if done >= config.trainer.steps:
        raise ForgeError(f"run {run.id} has done {done} of its {config.trainer.steps} steps; "
                         "give a larger --steps to train it further")
    resolve_model(config, home)
    store.update_run(run.id, owner_pid=os.getpid(), error=None, ended_at=None, config=config.model_dump(mode="json"),
                     isolation=isolation_for(config))
    return run.id, config


