"""`forge up --dry-run` / `forge train --dry-run`: what a config would run, and what would refuse it, with
nothing started (no engine, proxy, sandbox, model build or run row).

    plan = plan_run(config, home)    # the sections, every check's verdict, the Kubernetes manifests
    plan.failed                      # a check that would stop the run: the command exits 1

The checks are preflight's own (runs/prepare.py `preflight_checks`), all of them rather than the first
refusal, plus what only starts to fail once the run is under way: the model folder, the task set, a
GPU the config asks for, a teacher's key. On Kubernetes the pod (and its NetworkPolicy) that every
rollout would get is rendered and validated: forge's own check (`check_pod_manifest`, what the API
server refuses) and, where installed, kubernetes-validate's schemas of the API server's version.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openforge.config import ForgeConfig
from openforge.errors import ForgeError
from openforge.runs.checks import Check

DEPLOY_PROXY_PORT = 8700  # the controller's proxy port in deploy/k8s (controller.yaml)
KUBERNETES_SCHEMA_VERSION = "1.37"  # what deploy/k8s is validated against too (tests/deploy/test_kubernetes_deploy.py)


@dataclass
class Plan:
    sections: dict[str, list[tuple[str, str]]]  # title -> (key, value) lines
    checks: list[Check]
    manifests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.verdict == "missing"]


def plan_run(config: ForgeConfig, home: Path) -> Plan:
    checks: list[Check] = []
    sections = {"engine": _engine(config, home, checks), "sandboxes": _sandboxes(config),
                "trainer": _trainer(config, home, checks), "tasks": _tasks(config, checks),
                "tracking": _tracking(config, checks)}
    from openforge.runs.prepare import preflight_checks

    for name, check in preflight_checks(config):
        checks.append(_verdict(name, check))
    return Plan(sections, checks, _manifests(config, checks))


def _verdict(name: str, check: Any) -> Check:
    try:
        check()
    except ForgeError as exc:
        return Check(name, "missing", str(exc))
    return Check(name, "ok", "")


def _engine(config: ForgeConfig, home: Path, checks: list[Check]) -> list[tuple[str, str]]:
    e = config.engine
    lines = [("kind", e.kind), ("model", e.model or "the tiny demo model (built in FORGE_HOME on first use)")]
    if e.kind == "router":
        if e.router_url:
            lines += [("router", f"{e.router_url} (a cluster's; forge starts no workers)")]
        elif e.worker_urls:
            lines += [("replicas", f"{len(e.worker_urls)} running: {', '.join(e.worker_urls)}"),
                      ("router", f"sglang-router, policy {e.policy}")]
        else:
            lines += [("replicas", f"{e.workers} embedded workers on {e.device}"),
                      ("router", f"sglang-router, policy {e.policy}")]
    elif e.kind == "sglang":
        lines += [("replicas", "1 SGLang server"), ("GPUs", f"{e.tp_size} (tensor parallel)"),
                  ("dtype", e.dtype), ("max LoRA rank", str(e.max_lora_rank))]
    elif e.kind == "embedded":
        lines += [("replicas", "1 embedded engine"), ("device", e.device)]
    elif e.kind in ("url", "remote"):
        lines += [("url", e.url or "(none)")]
    if e.model and not (Path(e.model).expanduser() / "config.json").is_file():
        checks.append(Check("model", "missing", f"engine.model {e.model} is not a model folder here (no config.json)"))
    if e.kind == "sglang" or (e.kind in ("embedded", "router") and e.device == "cuda"):
        checks.append(_gpu(f"engine.kind = \"{e.kind}\"" + ("" if e.kind == "sglang" else " on cuda")))
    if e.kind == "remote" and e.api_key_env and not os.environ.get(e.api_key_env):
        checks.append(Check("teacher key", "missing", f"${e.api_key_env} (engine.api_key_env) is not set"))
    return lines


def _sandboxes(config: ForgeConfig) -> list[tuple[str, str]]:
    lines = [("backend", config.sandbox.type), *config.sandbox.plan_lines()]
    lines += [("concurrency", f"{config.runner.concurrency} rollouts at once"),
              ("harness", ", ".join(f"{n} ({w:g})" for n, w in config.harness.weights().items()))]
    return lines


def _trainer(config: ForgeConfig, home: Path, checks: list[Check]) -> list[tuple[str, str]]:
    t = config.trainer
    weights = "all weights" if t.full_finetune else (f"LoRA r={t.lora_r} alpha={t.lora_alpha} on "
                                                     f"{', '.join(t.lora_target_modules)}")
    lines = [("ranks", f"{t.nproc}" + (" under torchrun, FSDP2" if t.nproc > 1 else " (one process, no FSDP)")),
             ("device", t.device), ("weights", weights),
             ("steps", f"{t.steps} x {t.tasks_per_step} tasks x {config.runner.samples_per_task} rollouts = "
                       f"{t.tasks_per_step * config.runner.samples_per_task} rollouts a step"),
             ("loss", f"lr {t.lr:g} ({t.lr_schedule}), KL {t.kl_coef:g}, entropy {t.entropy_coef:g}, "
                      f"clip {t.clip_eps:g}, {t.loss_agg}")]
    if t.init_from:
        lines.append(("starts from", t.init_from))
        checks.append(_init_from(config, home))
    if t.device == "cuda":
        checks.append(_gpu(f"trainer.device = \"cuda\" with {t.nproc} rank(s)", need=t.nproc))
    return lines


def _gui(config: ForgeConfig) -> bool:
    """Whether a configured harness drives a browser (a pod's policy then admits the site relay); an
    unknown harness is the harness check's to report."""
    from openforge.rollouts.harnesses import harness_class

    try:
        return any(harness_class(n).gui for n in config.harness.weights())
    except ForgeError:
        return False


def _init_from(config: ForgeConfig, home: Path) -> Check:
    """trainer.init_from resolved as the run will (an adapter folder, or a run's final adapter), reading
    the store only if there is one: a dry run creates nothing."""
    from openforge.paths import db_path
    from openforge.runs.prepare import resolve_init_from
    from openforge.store import STORE_URL_ENV, open_store

    exists = bool(config.store.url or os.environ.get(STORE_URL_ENV)) or db_path(home).is_file()
    store = open_store(home, url=config.store.url) if exists else None
    try:
        resolve_init_from(store, config, home)
    except ForgeError as exc:
        return Check("init-from", "missing", str(exc))
    finally:
        if store is not None:
            store.close()
    return Check("init-from", "ok", "")


def _gpu(why: str, need: int = 1) -> Check:
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have >= need:
        return Check("GPU", "ok", f"{have} visible")
    return Check("GPU", "missing", f"{why} needs {need} GPU(s); this machine has {have}")


def _tasks(config: ForgeConfig, checks: list[Check]) -> list[tuple[str, str]]:
    from openforge.runs.prepare import load_run_tasks

    lines = [("set", config.tasks.path)]
    try:
        tasks = load_run_tasks(config)
    except ForgeError as exc:
        checks.append(Check("tasks", "missing", str(exc)))
        return lines
    kinds = Counter(task_kind(t) for t in tasks)
    lines += [("tasks", f"{len(tasks)}: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))]
    online = kinds.get("online-web", 0)
    lines.append(("online-only", f"{online} (need sandbox.allow_internet)" if online else "0"))
    return lines


def task_kind(task: Any) -> str:
    """How a task is run and graded, for the plan's counts: as its family describes it."""
    from openforge.rollouts.tasks.kinds import kind_of

    return kind_of(task).describe(task)


def _tracking(config: ForgeConfig, checks: list[Check]) -> list[tuple[str, str]]:
    t = config.tracking
    if not t.backends:
        return [("backends", "none (the run store only)")]
    lines = [("backends", ", ".join(t.backends)), ("project", t.project),
             ("dir", t.dir or "FORGE_HOME/runs/<run>/tracking")]
    if "mlflow" in t.backends:
        lines.append(("mlflow", t.mlflow_uri or "a SQLite store in the tracking dir"))
    if "wandb" in t.backends:
        offline = os.environ.get("WANDB_MODE", "").lower() == "offline" or t.wandb_mode == "offline"
        lines.append(("wandb", "offline" if offline else f"{t.wandb_mode}: online when the key is accepted, "
                                                         "else offline with a warning"))
        netrc = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
        if not offline and not os.environ.get("WANDB_API_KEY") and not netrc.is_file():
            # not checked with the server here (a dry run makes no network calls): the run does that
            checks.append(Check("W&B key", "warn", "no WANDB_API_KEY and no ~/.netrc: the run will log to W&B "
                                                   "offline (upload it later with `wandb sync`)"))
    return lines


def _manifests(config: ForgeConfig, checks: list[Check]) -> list[dict[str, Any]]:
    """What the backend creates in a cluster for every rollout (on Kubernetes, the pod and the NetworkPolicy
    that keeps it in), checked as the API server would; none for a backend on this machine."""
    port = config.proxy.port or DEPLOY_PROXY_PORT
    failure = None
    try:
        manifests = config.sandbox.plan_manifests(proxy_port=port, gui=_gui(config))
    except ForgeError as exc:
        manifests, failure = [], Check("pod manifest", "missing", str(exc))
    if not manifests and failure is None:
        return []
    if not config.proxy.port:
        checks.append(Check("proxy port", "warn", f"proxy.port = 0 picks a port at run time, which no NetworkPolicy "
                                                  f"can name: the policy below assumes deploy/k8s's {DEPLOY_PROXY_PORT}"))
    if failure is not None:
        checks.append(failure)
        return []
    try:
        import kubernetes_validate
    except ImportError:
        checks.append(Check("manifests", "warn", "not checked against the API schemas: pip install "
                                                 "'kubernetes-validate>=1.37,<1.38'"))
        return manifests
    for doc in manifests:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_SCHEMA_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            checks.append(Check(f"{doc['kind']} manifest", "missing",
                                f"Kubernetes {KUBERNETES_SCHEMA_VERSION} refuses it: {exc.message}"))
        else:
            checks.append(Check(f"{doc['kind']} manifest", "ok", f"valid for Kubernetes {KUBERNETES_SCHEMA_VERSION}"))
    return manifests
