"""`forge export RUN --format peft|merged [--step N] --out DIR`: which checkpoint of a run, over which base
model, into which folder; the weights themselves are written by `trainer/model_export.py`."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from openforge.config import stored_config
from openforge.errors import ConfigError, ForgeError
from openforge.runs.prepare import resolve_model
from openforge.store import Run, Store
from openforge.trainer.checkpoint import run_dir
from openforge.trainer.model_export import write_merged, write_peft

MODEL_FORMATS = ("peft", "merged")


@dataclass(frozen=True)
class ExportedModel:
    run_id: str
    step: int
    kind: str  # adapter | full: what the checkpoint held
    out: Path


def export_model(store: Store, home: Path, run_id: str, *, fmt: str, out: str | Path,
                 step: int | None = None) -> ExportedModel:
    """Write run `run_id`'s checkpoint of `step` (default: its newest) to the folder `out` as `fmt`."""
    if fmt not in MODEL_FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(MODEL_FORMATS)}, not {fmt!r}")
    dest = Path(out).expanduser()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ForgeError(f"--out {dest} exists and is not an empty folder; give a new one")
    run = store.get_run(run_id)
    checkpoints = _checkpoints(store, home, run)
    if not checkpoints:
        raise ForgeError(f"run {run.id} has no checkpoint to export (it saved no train step)")
    if step is None:
        step = max(checkpoints)
    elif step not in checkpoints:
        have = ", ".join(str(s) for s in sorted(checkpoints))
        raise ForgeError(f"run {run.id} has no checkpoint of step {step} (it has step {have})")
    kind, path = checkpoints[step]
    if not path.is_dir():
        raise ForgeError(f"the checkpoint of step {step} of run {run.id} is gone from {path}")
    full = kind == "full"
    if fmt == "peft" and full:
        raise ForgeError(f"run {run.id} trained all weights, so it has no adapter; export it with --format merged")
    if fmt == "merged" and not run.config_json:
        raise ForgeError(f"run {run.id} has no stored config, so its base model is unknown")
    # Written beside and renamed into place: an export cut short leaves no half folder at --out.
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    if fmt == "peft":
        write_peft(path, partial)
    else:
        # The base the trainer loaded: the run's engine.model (the demo's tiny model when it gave none).
        write_merged(resolve_model(stored_config(run.config_json), home), path, partial, full_finetune=full)
    if dest.exists():
        dest.rmdir()  # empty, checked above
    os.replace(partial, dest)
    return ExportedModel(run_id=run.id, step=step, kind=kind, out=dest)


def _checkpoints(store: Store, home: Path, run: Run) -> dict[int, tuple[str, Path]]:
    """step -> (adapter | full, folder): the store's checkpoint rows of a GRPO run; a `forge sft` run
    records none, so its saved `adapters/step-N` folders (complete once named so: checkpoint.py)."""
    rows = {c.step: (c.kind, Path(c.path)) for c in store.list_checkpoints(run.id)}
    if rows:
        return rows
    full = bool(run.config_json and stored_config(run.config_json).trainer.full_finetune)
    found = run_dir(home, run.id) / "adapters"
    folders = [p for p in found.glob("step-*") if p.is_dir() and p.name[len("step-"):].isdigit()]
    return {int(p.name[len("step-"):]): ("full" if full else "adapter", p) for p in folders}
