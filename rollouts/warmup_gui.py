"""A short supervised warm-up that teaches the tiny VLM the *format* of a mini-gui answer, not the answer.

The random tiny Qwen2-VL (engine/tiny_vl.py) never writes a parseable mini-gui action, so no rollout
of `forge up --demo --harness mini-gui` would ever be graded right and GRPO would have nothing to
reinforce. This warm-up trains it for a few seconds on mini-gui's own prompts (its system prompt and
user message, built by rollouts/harnesses/mini_gui_agent.py) over synthetic screenshots - a square of
a random colour on a white page, as the gui-colour site draws it - each answered `done(<colour>)` with
a colour drawn at random, *independently of the square's*. Afterwards the model writes a valid action
naming one of the colours, each about a quarter of the time, whatever the picture: it has learned the
format and nothing about the image. Which colour the picture shows is what RL then has to learn
(docs/gui.md, "Demo").

    warm_up_gui_answers(model_dir)   # trains the saved model in place; writes WARMUP_FILE
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

from rollouts.harnesses.mini_gui_agent import Screen, system_prompt, user_message
from rollouts.warmup import WARMUP_FILE
from rollouts.web.sites import COLOURS

INSTRUCTION = "What colour is the square? Answer with one word: red, green, blue or yellow."
SCREEN = (1024, 768)  # sandbox/gui.py DEFAULT_SIZE
SQUARE = (312, 184, 400)  # the gui-colour site's square: left, top, side (rollouts/web/sites.py)


def _screenshot(rgb: tuple[int, int, int], max_side: int, rng: random.Random) -> tuple[bytes, Screen]:
    """A gui-colour page as mini-gui sends it (downscaled to `max_side`), the square jittered a little
    so the warm-up does not memorise one picture."""
    from PIL import Image, ImageDraw

    w, h = SCREEN
    image = Image.new("RGB", SCREEN, (255, 255, 255))
    left, top, side = SQUARE
    dx, dy = rng.randint(-40, 40), rng.randint(-40, 40)
    ImageDraw.Draw(image).rectangle((left + dx, top + dy, left + dx + side - 1, top + dy + side - 1), fill=rgb)
    scale = min(1.0, max_side / max(w, h))
    shown = (max(1, round(w * scale)), max(1, round(h * scale)))
    image = image.resize(shown, Image.Resampling.LANCZOS)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue(), Screen(display="", max_side=max_side, grid=None, size=SCREEN, shown=shown)


def _example(processor: Any, rng: random.Random, max_side: int, eos: int) -> tuple[list[int], list[int], bytes]:
    from engine.vision import expand_image_tokens

    png, screen = _screenshot(rng.choice(list(COLOURS.values())), max_side, rng)
    user = user_message(INSTRUCTION, [], png, screen)
    # The proxy hands the template `{"type": "image"}` where an image goes (proxy/calls.py).
    content = [p if p["type"] == "text" else {"type": "image"} for p in user["content"]]
    messages = [{"role": "system", "content": system_prompt(None)}, {"role": "user", "content": content}]
    ids = processor.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    prompt = expand_image_tokens(ids, [png], processor)
    answer = processor.tokenizer.encode(f"done({rng.choice(list(COLOURS))})", add_special_tokens=False) + [eos]
    return prompt, answer, png


def warm_up_gui_answers(model_dir: str | Path, *, steps: int = 40, batch: int = 8, lr: float = 3e-3,
                        seed: int = 0, max_side: int = 64) -> dict:
    """Train the VLM in `model_dir` to answer the gui-colour question with `done(<a random colour>)`."""
    import torch
    from transformers import AutoModelForImageTextToText

    from engine.vision import VisionTokens, load_processor, mm_token_type_ids, pixel_inputs

    path = Path(model_dir)
    processor = load_processor(path)
    tokens = VisionTokens.from_processor(processor)
    model = AutoModelForImageTextToText.from_pretrained(str(path), dtype=torch.float32)
    eos = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = processor.tokenizer.pad_token_id
    rng = random.Random(seed)
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    model.train()
    for _ in range(steps):
        examples = [_example(processor, rng, max_side, eos) for _ in range(batch)]
        width = max(len(p) + len(a) for p, a, _ in examples)
        ids = torch.full((batch, width), pad)
        labels = torch.full((batch, width), -100)  # loss on the answer tokens only
        mask = torch.zeros((batch, width), dtype=torch.long)
        for i, (prompt, answer, _) in enumerate(examples):
            seq = prompt + answer
            ids[i, :len(seq)] = torch.tensor(seq)
            mask[i, :len(seq)] = 1
            labels[i, len(prompt):len(seq)] = torch.tensor(answer)
        pixels, grid = pixel_inputs([png for _, _, png in examples], processor)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels, pixel_values=pixels, image_grid_thw=grid,
                     mm_token_type_ids=mm_token_type_ids(ids, tokens)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(round(loss.item(), 4))
    model.save_pretrained(str(path))
    record = {"what": "answer mini-gui's gui-colour question with done(<colour>), the colour uniformly random "
                      "and independent of the picture", "steps": steps, "batch": batch, "lr": lr, "seed": seed,
              "max_side": max_side, "loss_first_last": [losses[0], losses[-1]]}
    (path / WARMUP_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return record
