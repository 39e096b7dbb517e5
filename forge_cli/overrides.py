"""Flags as config overrides: `forge up --demo`'s settings, `--set` items, then --steps/--name."""

from __future__ import annotations

from typing import Any

from openforge.config import parse_override

# `forge up --demo`: about 4 minutes on 2 CPU cores, and the reward curve rises under exact grading
# (docs/dashboard.md, "What the demo shows"). The tiny model (engine/tiny.py LEARNABLE_NORM_GAIN,
# then trainer/warmup/text.py) answers "Answer with a number." with one digit, any digit: ~1 in 10 right.
# One token an answer: the answer is exactly that digit, graded exactly (expect_answer number); GRPO
# learns to give the right one. lr 5e-3: at 2e-2 the policy collapsed to noise after a few steps.
DEMO_TASKS = ["easy-sum", "easy-count-words"]
DEMO_OVERRIDES: dict[str, Any] = {
    "name": "demo",
    "engine": {"kind": "embedded", "max_batch_size": 8},
    "sandbox": {"type": "local"},
    "harness": {"name": "mini", "max_turns": 2, "max_tokens": 1},
    "tasks": {"path": "builtin", "include": DEMO_TASKS},
    "runner": {"samples_per_task": 8, "concurrency": 8, "rollout_timeout_s": 120.0},
    "proxy": {"default_max_tokens": 1, "max_context_tokens": 4096},
    "trainer": {"steps": 12, "tasks_per_step": 2, "lr": 5e-3, "micro_batch_tokens": 2048},
}


# `forge up --demo --harness claude-code|codex`: the same tasks and warmed-up tiny model, through the
# real harness in local sandboxes (docs/dashboard.md, "With a real harness"). Claude Code's first
# prompt is ~48.5k tokens with the tiny tokenizer, Codex's ~24k: the model's whole context is
# allowed, one call may generate 2 tokens (a digit and the end of the turn; Claude Code asks for
# 32,000), and task time limits are scaled for a CPU engine (one cold 48k prefill per step, after each
# adapter load: ~15-30 s on 2 cores). The prompt is shared by every rollout of a step, so the engine's
# prefix cache computes it once and the trainer runs it once per group. One task, 16 samples: with two
# tasks the tiny model, like the mini demo's, learns one digit for both (at most 0.5), and 8 samples a
# group were too few to climb in 8 steps; lr 3e-3: at 5e-3 it rose to 0.44 and then collapsed into
# empty first answers, which Claude Code answers with a retry (docs/dashboard.md).
DEMO_HARNESSES: dict[str, dict[str, Any]] = {
    name: {
        "harness": {"name": name, "max_turns": 2},
        "engine": {"max_batch_size": 16},
        "tasks": {"include": ["easy-sum"]},
        "runner": {"samples_per_task": 16, "concurrency": 16, "time_limit_scale": 5.0, "rollout_timeout_s": 600.0},
        "proxy": {"max_context_tokens": 131072, "max_tokens_cap": 2, "default_max_tokens": 2, "call_timeout_s": 600.0},
        "trainer": {"steps": 8, "tasks_per_step": 1, "lr": 3e-3},
    }
    for name in ("claude-code", "codex")
}

# `forge up --demo --harness mini-gui`: the GUI loop on 2 cores (docs/gui.md, "Demo"). Each rollout
# gets its own X display and Chromium on a gui-colour-screen page served from the host (the whole
# screen red, or blue); mini-gui sends the screenshot (downscaled to 256 px: 24 image tokens for the
# tiny VLM) and reads one action. The tiny Qwen2-VL is warmed up to answer `done(red)` or `done(blue)`
# about half the time each, whatever the picture (trainer/warmup/gui.py): a policy blind to the
# screenshot scores at most 1/2. Both tasks every step, 12 rollouts each, so every group holds both
# answers and GRPO's signal is the picture. Measured (tests/test_vl_learn_exact.py, docs/gui.md): four
# colours, 64 px screenshots or a square on a white page stayed at chance in 12 steps; this rises.
# One action a rollout (max_turns 1), 8 tokens at most, no tools in the prompt (--no-tools).
DEMO_HARNESSES["mini-gui"] = {
    "harness": {"name": "mini-gui", "max_turns": 1, "max_tokens": 8, "extra_args": ["--no-tools", "--max-side", "256"]},
    "engine": {"max_batch_size": 16},
    "tasks": {"path": "builtin-web", "include": ["gui-colour-screen-red", "gui-colour-screen-blue"]},
    "runner": {"samples_per_task": 12, "concurrency": 12, "time_limit_scale": 3.0, "rollout_timeout_s": 300.0},
    "proxy": {"max_tokens_cap": 8, "default_max_tokens": 8, "call_timeout_s": 300.0},
    # kl_coef 0.2: without it the answer's format drifted once the colours were learnt (`doneblue)`,
    # `done()`: graded 0), and the reward fell back in the last steps; lr 3e-3: at 5e-3 one of three
    # random tiny VLMs lost its format for good (docs/gui.md)
    "trainer": {"steps": 12, "tasks_per_step": 2, "lr": 3e-3, "kl_coef": 0.2},
}


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


# `forge up --demo --harness browser-use`: the GUI demo's settings (the mini-gui entry, where it sets the
# tiny VLM and the GUI tasks), sized for browser-use: its prompt is ~14k tokens with the tiny VLM's
# byte-level tokenizer (a 24 KB system prompt; docs/harnesses.md), it asks for 4,096 output tokens (a
# browser-use action is a ~100-character JSON object: 256 is plenty), and each rollout starts its own
# Chromium (~10-30 s on 2 loaded cores): fewer at once, task limits scaled. mini-gui's extra_args
# (e.g. --grid) are not browser-use's.
DEMO_HARNESSES["browser-use"] = _merge(DEMO_HARNESSES.get("mini-gui", {}), {
    "harness": {"name": "browser-use", "max_turns": 2, "extra_args": []},
    "engine": {"max_batch_size": 4},
    "runner": {"samples_per_task": 4, "concurrency": 4, "time_limit_scale": 5.0, "rollout_timeout_s": 600.0},
    "proxy": {"max_context_tokens": 32768, "max_tokens_cap": 256, "default_max_tokens": 256, "call_timeout_s": 600.0},
    # ~100 s a rollout here, and the tiny VLM never writes browser-use's JSON (every reward 0): a short
    # run that shows the loop (4 rollouts a step, 3 steps: ~7 min), not the mini-gui demo's 12 x 24.
    "trainer": {"steps": 3, "tasks_per_step": 1},
})


def cli_overrides(*, demo: bool, sets: list[str], steps: int | None, name: str | None,
                  harness: str | None = None) -> dict[str, Any]:
    """Flags as config overrides: the demo's settings (for `harness`, if given), then `--set` items,
    then --harness/--steps/--name on top."""
    data: dict[str, Any] = dict(DEMO_OVERRIDES) if demo else {}
    if demo and harness in DEMO_HARNESSES:
        data = _merge(data, DEMO_HARNESSES[harness])
    if harness is not None:
        data = _merge(data, {"harness": {"name": harness}})
    for item in sets:
        data = _merge(data, parse_override(item))
    if steps is not None:
        data = _merge(data, {"trainer": {"steps": steps}})
    if name is not None:
        data["name"] = name
    return data
