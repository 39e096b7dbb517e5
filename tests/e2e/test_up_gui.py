"""`forge up --demo --harness mini-gui`, short: the GUI loop end to end on 2 cores. Each rollout gets
its own X display and Chromium on a gui-colour-screen page served from the host, the mini-gui agent sends the
screenshot through the recording proxy to the embedded engine serving the tiny Qwen2-VL, and two GRPO
steps train on the recorded calls, with a LoRA hot-load between them.

What it proves, on the recorded data: every call carries exactly one stored screenshot (the file's
sha256 is its name, its placeholder run in the prompt has the processor's length), every trajectory
keeps that image and its sampled tokens are exactly the engine's completion tokens, every reward is
an exact grade of the answer mini-gui reported (0 or 1, never a harness error scored), and step 1 is
served by step 0's adapter, and the screenshot Chromium showed is what the warm-up and the fast-path
learning test (tests/trainer/test_vl_learn_exact.py) draw: the screen the task's colour. The full demo and
its curve are in docs/gui.md ("Demo")."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest

from openforge.image_store import ImageStore, image_id
from openforge.store import Store
from tests.helpers.up import forge, served_with_adapter
from tests.helpers.required import requires

needs_gui = requires("chromium", None if all(shutil.which(p) for p in ("Xvfb", "xdotool", "chromium")) else
                     "GUI rollouts need Xvfb, xdotool and chromium (install.sh installs them)")


@pytest.fixture(scope="module")
def warmed_vl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's tiny VLM with a shorter warm-up (the format is learnt in ~15 steps)."""
    from openforge.engine.tiny import LEARNABLE_NORM_GAIN
    from openforge.engine.tiny_vl import build_tiny_vl_model
    from openforge.trainer.warmup.gui import warm_up_gui_answers

    path = tmp_path_factory.mktemp("vl") / "tiny-vl-gui"
    build_tiny_vl_model(path, norm_gain=LEARNABLE_NORM_GAIN)
    warm_up_gui_answers(path, steps=15)
    return path


@pytest.mark.slow
@pytest.mark.timeout(900)
@needs_gui
def test_demo_through_mini_gui(forge_home: Path, warmed_vl: Path) -> None:
    from openforge.engine.vision import VisionTokens, load_processor, pixel_inputs, placeholder_runs
    from openforge.rollouts.tasks.grading import ExpectedAnswer, answer_matches
    from openforge.rollouts.harnesses.mini_gui_agent import BadAction, parse_text_action
    from PIL import Image

    from openforge.rollouts.tasks.web.sites import COLOURS

    shutil.copytree(warmed_vl, forge_home / "models" / "tiny-vl-gui")  # where the demo looks for its model
    out = forge(forge_home, "--set", "runner.samples_per_task=4", "--set", "runner.concurrency=4",
                "--set", "trainer.tasks_per_step=1", "up", "--demo", "--harness", "mini-gui", "--headless",
                "--steps", "2", timeout=840)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    store = Store(forge_home / "forge.db")
    run = store.list_runs(limit=1)[0]
    assert run.status == "finished" and run.isolation.startswith("bwrap")
    assert len(store.list_train_steps(run.id)) == 2
    images = ImageStore.for_run(forge_home, run.id)
    proc = load_processor(forge_home / "models" / "tiny-vl-gui")
    pad = VisionTokens.from_processor(proc).image_token_id

    for step in (0, 1):
        rollouts = store.list_rollouts(run.id, step=step)
        assert len(rollouts) == 4
        for r in rollouts:
            assert r.status == "scored" and r.reward in (0.0, 1.0), (r.status, r.reward, r.error)
        calls = [c for c in store.list_calls(run_id=run.id) if c.rollout_id in {r.id for r in rollouts}]
        assert len(calls) == 4 and all(c.status == "ok" and c.api == "openai_chat" for c in calls)
        for c in calls:
            assert c.images and len(c.images) == 1
            data = images.get(c.images[0])  # raises if the file is missing or does not match its name
            assert image_id(data) == c.images[0]
            _, grid = pixel_inputs([data], proc)
            runs = placeholder_runs(c.prompt_ids, pad)
            assert [b - a for a, b in runs] == [int(grid.prod()) // proc.image_processor.merge_size ** 2]
        for r in rollouts:  # what Chromium showed, as mini-gui sent it: the task's colour, screen-wide
            call = next(c for c in calls if c.rollout_id == r.id)
            shown = Image.open(io.BytesIO(images.get(call.images[0]))).convert("RGB")
            assert shown.size == (256, 192)  # 1024x768 downscaled to the demo's --max-side 256
            count, rgb = max(shown.getcolors(256 * 192))
            assert rgb == COLOURS[r.task_id.removeprefix("gui-colour-screen-")] and count > 0.95 * 256 * 192
        for r in rollouts:  # the trained tokens (and image) are the sampled ones, exactly
            call = next(c for c in calls if c.rollout_id == r.id)
            trajs = store.list_trajectories(rollout_ids=[r.id])
            assert len(trajs) == 1 and trajs[0].images == call.images
            assert [t for t, m in zip(trajs[0].token_ids, trajs[0].loss_mask) if m] == call.completion_ids
            # The reward is the exact grade of the colour the policy named in its one action.
            text = proc.tokenizer.decode(call.completion_ids, skip_special_tokens=True)
            try:
                action = parse_text_action(text, None)
            except BadAction:
                action = None  # not an action: the step limit ends the rollout, graded with no answer
            named = action.args[0] if action is not None and action.name == "done" else ""
            want = ExpectedAnswer(words=r.task_id.removeprefix("gui-colour-screen-"))
            assert r.reward == (1.0 if answer_matches(want, named) else 0.0), (text, r.task_id, r.reward)
    assert served_with_adapter(store, run.id, 1, f"{run.id}-step-0")  # step 1 ran on step 0's adapter
