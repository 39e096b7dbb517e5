"""Flags as config overrides: `forge up --demo`'s settings, `--set` items, then --steps/--name."""

from __future__ import annotations

from typing import Any

from openforge.config import parse_override

# `forge up --demo`: about 3 minutes on 2 CPU cores, and the reward curve rises (docs/dashboard.md,
# "What the demo shows"). The tiny model's weights are random but peaked (engine/tiny.py
# LEARNABLE_NORM_GAIN): at first it mostly answers nothing (0) or noise (0.2); these two tasks give 1.0
# for an answer containing the right digit, which noise sometimes does, so a group of 8 has different
# rewards and GRPO an advantage from the first step. 6 tokens an answer keep the base pass rate low.
DEMO_TASKS = ["easy-sum", "easy-count-words"]
DEMO_OVERRIDES: dict[str, Any] = {
    "name": "demo",
    "engine": {"kind": "embedded", "max_batch_size": 8},
    "sandbox": {"type": "local"},
    "harness": {"name": "mini", "max_turns": 2, "max_tokens": 6},
    "tasks": {"path": "builtin", "include": DEMO_TASKS},
    "runner": {"samples_per_task": 8, "concurrency": 8, "rollout_timeout_s": 120.0},
    "proxy": {"default_max_tokens": 6, "max_context_tokens": 4096},
    "trainer": {"steps": 12, "tasks_per_step": 2, "lr": 2e-2, "micro_batch_tokens": 2048},
}


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def cli_overrides(*, demo: bool, sets: list[str], steps: int | None, name: str | None) -> dict[str, Any]:
    """Flags as config overrides: the demo's settings, then `--set` items, then --steps/--name on top."""
    data: dict[str, Any] = dict(DEMO_OVERRIDES) if demo else {}
    for item in sets:
        data = _merge(data, parse_override(item))
    if steps is not None:
        data = _merge(data, {"trainer": {"steps": steps}})
    if name is not None:
        data["name"] = name
    return data
