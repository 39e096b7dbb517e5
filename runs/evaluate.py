"""`forge eval` without the CLI: preflight, the engine and proxy, every task k times, the outcome.

    run, metrics = evaluate(store, config, tasks, home=home, on_progress=print_rollout)

Ctrl-C or SIGTERM (`forge stop`) cancels the rollouts; the runner stops their sandboxes first. An
eval whose every rollout failed for infra or harness reasons is `failed` with the most frequent one.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from openforge.config import ForgeConfig
from openforge.errors import ConfigError
from openforge.store import Rollout, Run, Store
from openforge.runs.prepare import isolation_for, preflight, resolve_model
from openforge.runs.stack import Stack
from openforge.rollouts.runner.failures import PromptDoesNotFit, StepFailed

T = TypeVar("T")


def evaluate(store: Store, config: ForgeConfig, tasks: Sequence[Any], *, home: Path, name: str = "",
             adapter: str | None = None, on_start: Callable[[ForgeConfig, str], Any] | None = None,
             on_progress: Callable[[Rollout], Any] | None = None, compare: str | None = None) -> tuple[Run, Any]:
    """Run `tasks` x `runner.samples_per_task`; return the eval run and its metrics (rollouts.metrics).
    `compare`: an earlier eval run (id or unique prefix), checked before anything starts; the run's
    summary then holds the difference of the two, paired by task (rollouts/analysis/eval_figures.py).

    StepFailed when every rollout failed for infra/harness reasons; KeyboardInterrupt when cancelled;
    NotFoundError or ConfigError for a `compare` that is no finished eval."""
    from openforge.rollouts.runner.evaluate import run_eval

    base = store.get_run(compare) if compare is not None else None
    if base is not None and (base.kind != "eval" or base.status != "finished"):
        raise ConfigError(f"--compare {compare}: run {base.id} is a {base.status} {base.kind} run, not a finished eval")

    preflight(config, home)  # no Docker, no cluster, no SGLang, no harness: one line now, not N failed rollouts
    isolation = isolation_for(config)
    model = str(resolve_model(config, home))
    config = config.model_copy(update={"engine": config.engine.model_copy(update={"model": model})})
    adapter_path = adapter_folder(store, config, home, adapter)
    with Stack(config, store, client=adapter_path is not None) as stack:
        if adapter_path is not None:
            adapter = load_adapter(stack, adapter_path)
        if on_start is not None:
            on_start(config, stack.proxy_url)
        job = run_eval(store, config, list(tasks), proxy_url=stack.proxy_url, samples=config.runner.samples_per_task,
                       k_values=config.runner.pass_k, name=name, adapter=adapter, on_progress=on_progress,
                       proxy_socket=stack.proxy_socket, compare_with=base.id if base is not None else None)
        try:
            run, metrics = asyncio.run(cancel_on_sigterm(job))
        except asyncio.CancelledError:
            raise KeyboardInterrupt from None
    store.update_run(run.id, isolation=isolation)
    try:
        rollouts = store.list_rollouts(run.id)
        PromptDoesNotFit.check(f"eval {run.id}", rollouts)  # the harness's prompt over the context: its fix
        StepFailed.check(f"eval {run.id}", rollouts)
    except (StepFailed, PromptDoesNotFit) as exc:
        store.set_run_status(run.id, "failed", error=str(exc))
        raise
    return store.get_run(run.id), metrics


def adapter_folder(store: Store, config: ForgeConfig, home: Path, adapter: str | None) -> Path | None:
    """`--adapter` as a checked LoRA folder to load into the engine: a folder, or a run (id, prefix,
    'latest') whose final adapter it is. None for no adapter, or for a name the engine already serves
    (engine.kind = "url" with adapters loaded by whoever runs it)."""
    from openforge.errors import NotFoundError
    from openforge.runs.prepare import resolve_init_from

    if not adapter:
        return None
    if config.engine.kind == "url" and not Path(adapter).expanduser().exists():
        try:
            store.get_run(adapter)
        except NotFoundError:
            return None  # an adapter name the running engine knows
    probe = config.model_copy(update={"trainer": config.trainer.model_copy(update={"init_from": adapter})})
    try:
        checked = resolve_init_from(store, probe, home).trainer.init_from
    except ConfigError as exc:  # the same checks as --init-from's, said of this flag
        raise ConfigError(str(exc).replace("--init-from", "--adapter")) from None
    return Path(checked) if checked else None


def load_adapter(stack: Stack, path: Path) -> str:
    """Load `path` into the stack's engine under a name of its own; the name the rollouts ask for."""
    import hashlib

    if stack.client is None or stack.bridge is None:
        raise ConfigError("--adapter FOLDER needs an engine forge runs (embedded or sglang), not a teacher's endpoint")
    name = "eval-" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
    stack.bridge.run(stack.client.load_lora_adapter(name, str(path)))
    return name


async def cancel_on_sigterm(job: Coroutine[Any, Any, T]) -> T:
    """Run `job`; SIGTERM (what `forge stop` sends) cancels it like Ctrl-C, so its sandboxes are stopped."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(job)
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await task
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
