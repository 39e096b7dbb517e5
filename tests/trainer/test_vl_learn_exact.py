"""The mini-gui demo's learning, on the fast path: the tiny Qwen2-VL learns to tell the demo's two
screens apart under the demo's exact grade, with the demo's settings, in the demo's step budget.

Everything but the browser is the demo's own: the model built and warmed up as `forge up --demo
--harness mini-gui` builds it (trainer/warmup/gui.py: the answer format, each colour about half the
time, independent of the picture), the prompt ids mini-gui's first call renders to (its system prompt
and user message, the screenshot as the proxy expands it), the screenshot as mini-gui downscales the
gui-colour-screen page (every pixel one colour), the embedded engine sampling with `image_data`, the
reply parsed by mini-gui's own parser and graded by the task's `expect_answer` exactly as the runner
grades it, and GRPO + LoRA with the trainer settings and group size of openforge/presets/demo-mini-gui.toml. What
it leaves out is Chromium and the sandbox: tests/e2e/test_up_gui.py runs those end to end.

Two colours, one task each: a policy blind to the screenshot scores at most 1/2 (whatever it says,
each colour is right on one task of two). The assertions are on the mean of the last three steps
against the first three and against that bound, on a fixed seed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from openforge.config import TrainerConfig
from openforge.store import Store

DEMO = "mini-gui"


def _demo_settings() -> tuple[dict, int, int]:
    from openforge.presets import read_preset

    demo = read_preset(f"demo-{DEMO}")
    args = demo["harness"]["extra_args"]
    return demo["trainer"], demo["runner"]["samples_per_task"], int(args[args.index("--max-side") + 1])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_tiny_vlm_learns_the_demo_screens_under_the_exact_grade(tmp_path: Path, store: Store,
                                                                   forge_home: Path) -> None:
    from openforge.engine.tiny import LEARNABLE_NORM_GAIN
    from openforge.engine.tiny_vl import build_tiny_vl_model
    from openforge.engine.vision import load_processor
    from openforge.presets import read_preset
    from openforge.rollouts.tasks.grading import answer_matches
    from openforge.rollouts.harnesses.mini_gui_agent import BadAction, parse_text_action
    from openforge.rollouts.tasks.format import load_tasks
    from openforge.rollouts.tasks.web.payload import WebPayload
    from openforge.trainer.warmup.gui import demo_prompt, screenshot, warm_up_gui_answers
    from tests.helpers.vl import embedded_engine
    from openforge.trainer.loop import train
    from openforge.trainer.adapter_sync import AdapterSync
    from openforge.trainer.bridge import BackgroundLoop
    from openforge.trainer.samplers import EngineSampler

    trainer, group, max_side = _demo_settings()
    include = read_preset(f"demo-{DEMO}")["tasks"]["include"]
    specs = {t.id: t for t in load_tasks(read_preset(f"demo-{DEMO}")["tasks"]["path"]) if t.id in include}
    assert sorted(specs) == sorted(include) and len(specs) == 2

    t0 = time.perf_counter()
    model_dir = build_tiny_vl_model(tmp_path / "vl", norm_gain=LEARNABLE_NORM_GAIN)
    warm_up_gui_answers(model_dir, max_side=max_side)  # the demo's warm-up (runs/prepare.py)
    warm_s = time.perf_counter() - t0
    proc = load_processor(model_dir)
    eos = proc.tokenizer.convert_tokens_to_ids("<|im_end|>")
    tasks = []
    for spec in specs.values():
        png, screen = screenshot(spec.payload(WebPayload).gui.params["screen"], max_side)  # type: ignore[union-attr]
        tasks.append({"id": spec.id, "spec": spec, "images": [png],
                      "prompt_ids": demo_prompt(proc, png, screen, spec.instruction)})

    said: dict[str, list[str]] = {}

    def graded(task: dict, completion: list[int]) -> float:
        """mini-gui's reading of the reply, then the runner's exact grade of the answer (an invalid
        action ends the one-turn rollout at the step limit: graded with an empty answer)."""
        text = proc.tokenizer.decode(completion, skip_special_tokens=True)
        try:
            action = parse_text_action(text, None)
            answer = action.args[0] if action.name == "done" else ""
        except BadAction:
            answer = ""
        said.setdefault(task["id"], []).append(answer)
        return 1.0 if answer_matches(task["spec"].expect_answer, answer) else 0.0

    cfg = TrainerConfig(**{**trainer, "tasks_per_step": len(tasks)}, seed=0, device="cpu")
    run = store.create_run(kind="train", name="learn-exact")
    bridge = BackgroundLoop()
    with embedded_engine(model_dir) as client:
        sampler = EngineSampler(client, store, bridge, reward_fn=graded, group_size=group, max_new_tokens=8,
                                temperature=1.0, stop_token_ids=[eos], home=forge_home)
        result = train(store, run.id, cfg, model_path=model_dir, tasks=tasks, sampler=sampler,
                       engine=AdapterSync(client, bridge), home=forge_home)
        bridge.run(client.aclose())
    bridge.close()
    curve = [m["reward_mean"] for m in result.steps]
    print(f"\nreward per step: {[round(r, 3) for r in curve]}  warm-up {warm_s:.0f}s  "
          f"total {time.perf_counter() - t0:.0f}s")
    assert len(curve) == trainer["steps"] == 12
    first, last = sum(curve[:3]) / 3, sum(curve[-3:]) / 3
    # Chance for a policy blind to the screenshot is at most 1/2; the warm-up starts there.
    assert first < 0.6, curve
    assert last > 0.7 and last > first + 0.15, curve
    # And it is the picture it learnt: each screen's own colour, on each task, in the last steps.
    rollouts = [r for r in store.list_rollouts(run.id) if r.step is not None and r.step >= len(curve) - 3]
    for task_id in specs:
        rewards = [r.reward for r in rollouts if r.task_id == task_id]
        assert sum(rewards) / len(rewards) > 0.55, (task_id, curve)


def test_a_model_from_an_older_warm_up_is_not_taken_for_the_demo_s(tmp_path: Path) -> None:
    """runs/prepare.py rebuilds FORGE_HOME's tiny VLM unless it holds this warm-up (its version)."""
    import json

    from openforge.trainer.warmup.text import WARMUP_FILE
    from openforge.trainer.warmup.gui import WARMUP_VERSION, WHAT, is_warmed_up

    assert not is_warmed_up(tmp_path)  # no record
    old = {"what": "answer mini-gui's gui-colour question with done(<colour>), the colour uniformly random "
                   "and independent of the picture", "steps": 40, "max_side": 64}  # the 4-colour, 64 px one
    (tmp_path / WARMUP_FILE).write_text(json.dumps(old))
    assert not is_warmed_up(tmp_path)
    (tmp_path / WARMUP_FILE).write_text(json.dumps({"what": WHAT, "version": WARMUP_VERSION, "steps": 15}))
    assert is_warmed_up(tmp_path)  # any step count: tests warm up for fewer steps
    (tmp_path / WARMUP_FILE).write_text("{not json")
    assert not is_warmed_up(tmp_path)
