"""A short supervised warm-up that teaches the tiny VLM the *format* of a mini-gui answer, not the answer.

The random tiny Qwen2-VL (engine/tiny_vl.py) never writes a parseable mini-gui action, so no rollout
of `forge up --demo --harness mini-gui` would ever be graded right and GRPO would have nothing to
reinforce. This warm-up trains it for a few seconds on mini-gui's own prompts (its system prompt and
user message, built by rollouts/harnesses/mini_gui_agent.py, rendered by the model's chat template as
the proxy renders them) over synthetic screenshots of the demo's page - the whole screen one colour,
as the gui-colour site's `screen` page shows it, downscaled as mini-gui downscales - each answered
`done(<colour>)`. The answers are spread evenly over the candidate words (each batch names each
colour equally often, in a random order) and drawn *independently of the screenshot*. Afterwards the
model writes a valid action naming red or blue, about half the time each, whatever the picture: it
has learned the format and nothing about the image. Which colour the picture shows is what RL then
has to learn (docs/gui.md, "Demo").

    warm_up_gui_answers(model_dir)   # trains the saved model in place; writes WARMUP_FILE
    is_warmed_up(model_dir)          # whether model_dir holds this warm-up (settings and version)
    demo_prompt(processor, png, screen)  # the prompt ids the proxy sends for a demo screenshot
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

from openforge.rollouts.harnesses.mini_gui_agent import Screen, system_prompt, user_message
from openforge.trainer.warmup.text import WARMUP_FILE
from openforge.rollouts.tasks.web.generate import SCREEN_COLOURS, SCREEN_INSTRUCTION
from openforge.rollouts.tasks.web.sites import COLOURS

SCREEN = (1024, 768)  # sandbox/gui.py DEFAULT_SIZE
MAX_SIDE = 256  # mini-gui's --max-side in the demo: 256x192, 24 image tokens for the tiny VLM
# Bumped whenever what the warm-up teaches changes, so a FORGE_HOME's older warmed model is rebuilt.
WARMUP_VERSION = 2
WHAT = ("answer mini-gui's gui-colour-screen question with done(<colour>), the colours spread evenly "
        "and independent of the picture")


def screenshot(colour: str, max_side: int = MAX_SIDE) -> tuple[bytes, Screen]:
    """The gui-colour site's `screen` page of `colour` as mini-gui sends it: every pixel that colour,
    downscaled so its longer side is `max_side` (LANCZOS, as mini_gui_agent.Screen.screenshot_png)."""
    from PIL import Image

    w, h = SCREEN
    scale = min(1.0, max_side / max(w, h))
    shown = (max(1, round(w * scale)), max(1, round(h * scale)))
    image = Image.new("RGB", SCREEN, COLOURS[colour]).resize(shown, Image.Resampling.LANCZOS)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=False)
    return out.getvalue(), Screen(display="", max_side=max_side, grid=None, size=SCREEN, shown=shown)


def demo_prompt(processor: Any, png: bytes, screen: Screen, instruction: str = SCREEN_INSTRUCTION) -> list[int]:
    """mini-gui's first call for a task (no tools, no history), rendered by the chat template as the
    proxy renders it, the image's placeholder run expanded as the processor does (engine/vision.py)."""
    from openforge.engine.vision import expand_image_tokens

    user = user_message(instruction, [], png, screen)
    # The proxy hands the template `{"type": "image"}` where an image goes (proxy/calls.py).
    content = [p if p["type"] == "text" else {"type": "image"} for p in user["content"]]
    messages = [{"role": "system", "content": system_prompt(None)}, {"role": "user", "content": content}]
    ids = processor.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    return expand_image_tokens(ids, [png], processor)


def _settings(steps: int, batch: int, lr: float, seed: int, max_side: int, colours: tuple[str, ...]) -> dict:
    return {"what": WHAT, "version": WARMUP_VERSION, "colours": list(colours), "steps": steps, "batch": batch,
            "lr": lr, "seed": seed, "max_side": max_side}


def is_warmed_up(model_dir: str | Path) -> bool:
    """Whether `model_dir` holds this version of the warm-up (any step count: tests use shorter ones)."""
    try:
        record = json.loads((Path(model_dir) / WARMUP_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("what") == WHAT and record.get("version") == WARMUP_VERSION


def warm_up_gui_answers(model_dir: str | Path, *, steps: int = 40, batch: int = 8, lr: float = 3e-3,
                        seed: int = 0, max_side: int = MAX_SIDE, colours: tuple[str, ...] = SCREEN_COLOURS) -> dict:
    """Train the VLM in `model_dir` to answer the demo's question with `done(<one of colours>)`, the
    colour independent of the screenshot."""
    import torch
    from transformers import AutoModelForImageTextToText

    from openforge.engine.vision import VisionTokens, load_processor, mm_token_type_ids, pixel_inputs

    if batch % len(colours):
        raise ValueError(f"batch {batch} does not split evenly over {len(colours)} colours")
    path = Path(model_dir)
    processor = load_processor(path)
    tokens = VisionTokens.from_processor(processor)
    model = AutoModelForImageTextToText.from_pretrained(str(path), dtype=torch.float32)
    eos = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = processor.tokenizer.pad_token_id
    rng = random.Random(seed)
    torch.manual_seed(seed)
    shots = {c: screenshot(c, max_side) for c in colours}
    prompts = {c: demo_prompt(processor, *shots[c]) for c in colours}
    answers = {c: processor.tokenizer.encode(f"done({c})", add_special_tokens=False) + [eos] for c in colours}
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    model.train()
    for _ in range(steps):
        said = list(colours) * (batch // len(colours))  # each answer equally often in every batch ...
        rng.shuffle(said)
        shown = [rng.choice(colours) for _ in range(batch)]  # ... and each picture drawn on its own
        width = max(len(prompts[s]) + len(answers[a]) for s, a in zip(shown, said))
        ids = torch.full((batch, width), pad)
        labels = torch.full((batch, width), -100)  # loss on the answer tokens only
        mask = torch.zeros((batch, width), dtype=torch.long)
        for i, (s, a) in enumerate(zip(shown, said)):
            seq = prompts[s] + answers[a]
            ids[i, :len(seq)] = torch.tensor(seq)
            mask[i, :len(seq)] = 1
            labels[i, len(prompts[s]):len(seq)] = torch.tensor(answers[a])
        pixels, grid = pixel_inputs([shots[s][0] for s in shown], processor)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels, pixel_values=pixels, image_grid_thw=grid,
                     mm_token_type_ids=mm_token_type_ids(ids, tokens)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(round(loss.item(), 4))
    model.save_pretrained(str(path))
    record = {**_settings(steps, batch, lr, seed, max_side, tuple(colours)), "loss_first_last": [losses[0], losses[-1]]}
    (path / WARMUP_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return record
