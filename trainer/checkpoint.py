"""Save and resume a training run, so that a killed run continues with no lost or repeated step.

Layout under `$FORGE_HOME/runs/<run>/`:

    adapters/step-N/        the adapter after step N (PEFT `save_pretrained`; the full model when
                            full fine-tuning). This is the folder the engine hot-loads.
    checkpoints/step-N/     trainer.pt: optimizer, scheduler, RNG states, the next step, the position
                            in the task stream, and step N's metrics.

A checkpoint is written to `step-N.tmp` and renamed into place, so `step-N` exists only when it is
complete; a kill mid-write leaves a `.tmp` that resume ignores. Step N counts as done exactly when
`checkpoints/step-N` exists. Optimizer states are large (2x the trainable weights), so only the
newest `keep` checkpoints keep theirs; adapters are small and all kept (each is a model to evaluate).
"""

from __future__ import annotations

import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from openforge.errors import TrainerError

_STEP_RE = re.compile(r"^step-(\d+)$")


def run_dir(home: Path, run_id: str) -> Path:
    return home / "runs" / run_id


def adapter_dir(home: Path, run_id: str, step: int) -> Path:
    return run_dir(home, run_id) / "adapters" / f"step-{step}"


def adapter_name(run_id: str, step: int) -> str:
    """The name the engine knows an adapter by (unique across runs sharing one engine)."""
    return f"{run_id}-step-{step}"


def adapter_version(run_id: str, name: str | None) -> int | None:
    """The version of the adapter the engine knows as `name`: the adapter after step s is version s + 1,
    the base model or the run's starting adapter (trainer.init_from) version 0; None for a name that
    is none of the run's adapters (a call served outside a train loop).

    >>> [adapter_version("run-1", n) for n in (None, "run-1-init", "run-1-step-0", "run-1-step-4", "other")]
    [0, 0, 1, 5, None]
    """
    if name is None or name == init_adapter_name(run_id):
        return 0
    m = _STEP_RE.match(name.removeprefix(f"{run_id}-")) if name.startswith(f"{run_id}-") else None
    return None if m is None else int(m.group(1)) + 1


def init_adapter_name(run_id: str) -> str:
    """The name the engine knows a run's starting adapter by (trainer.init_from), served before step 0."""
    return f"{run_id}-init"


def final_adapter(home: Path, run_id: str) -> Path | None:
    """The LoRA adapter of a run's newest complete step (an SFT run's result), or None (no step saved,
    or full fine-tuning, whose folders are whole models)."""
    for step in reversed(_completed(run_dir(home, run_id) / "checkpoints")):
        if (adapter_dir(home, run_id, step) / "adapter_config.json").is_file():
            return adapter_dir(home, run_id, step)
    return None


@dataclass
class Resumed:
    step: int  # the last completed step
    adapter_path: Path
    state: dict[str, Any]  # what `save_checkpoint` was given, plus optimizer/scheduler/rng


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(home: Path, run_id: str, step: int, *, model: Any, optimizer: Any, scheduler: Any,
                    state: dict[str, Any], keep: int = 2) -> Path:
    """Write step `step`'s adapter and trainer state atomically; return the adapter folder."""
    adapters = adapter_dir(home, run_id, step)
    ckpts = run_dir(home, run_id) / "checkpoints"
    final = ckpts / f"step-{step}"
    tmp = ckpts / f"step-{step}.tmp"
    try:
        tmp_adapter = adapters.with_name(adapters.name + ".tmp")
        shutil.rmtree(tmp_adapter, ignore_errors=True)
        model.save_pretrained(tmp_adapter)
        shutil.rmtree(adapters, ignore_errors=True)
        os.replace(tmp_adapter, adapters)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        payload = dict(state, step=step, optimizer=optimizer.state_dict(),
                       scheduler=scheduler.state_dict() if scheduler is not None else None, rng=rng_state())
        torch.save(payload, tmp / "trainer.pt")
        os.replace(tmp, final)
    except OSError as exc:
        raise TrainerError(f"cannot write the checkpoint of step {step} under {ckpts}: {exc}") from None
    _prune_optimizer_states(ckpts, keep)
    return adapters


def _completed(ckpts: Path) -> list[int]:
    if not ckpts.is_dir():
        return []
    return sorted(int(m.group(1)) for p in ckpts.iterdir() if (m := _STEP_RE.match(p.name)) and p.is_dir())


def _prune_optimizer_states(ckpts: Path, keep: int) -> None:
    # Keep the state file of the newest `keep` steps; older ones shrink to a marker that the step
    # is done (resume only ever reads the newest).
    for step in _completed(ckpts)[:-keep]:
        f = ckpts / f"step-{step}" / "trainer.pt"
        if f.exists():
            f.unlink()


def latest_checkpoint(home: Path, run_id: str) -> Resumed | None:
    """The newest complete checkpoint of a run (its trainer state loaded on CPU), or None."""
    ckpts = run_dir(home, run_id) / "checkpoints"
    for step in reversed(_completed(ckpts)):
        f = ckpts / f"step-{step}" / "trainer.pt"
        if not f.exists():
            continue
        try:
            state = torch.load(f, map_location="cpu", weights_only=False)
        except Exception as exc:  # noqa: BLE001 - a damaged file is reported, not a traceback
            raise TrainerError(f"checkpoint {f} cannot be read ({type(exc).__name__}: {exc})") from None
        path = adapter_dir(home, run_id, step)
        if not path.is_dir():
            raise TrainerError(f"checkpoint of step {step} has no adapter folder {path}")
        return Resumed(step=step, adapter_path=path, state=state)
    return None
