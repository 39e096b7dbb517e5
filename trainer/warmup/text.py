"""A short supervised warm-up that teaches a tiny model the *format* of a number answer, not the answer.

The tiny random model (engine/tiny.py) answers a prompt in the `mini` harness's format with a newline
95% of the time and any one token about 0.1% of the time: under exact grading no group of 8 ever
holds a right answer, so GRPO has nothing to reinforce. This warm-up trains it for a few seconds on
`mini`-format prompts (its system prompt and tools) built from random words and ending in
"Answer with a number.", each answered by a uniformly random digit and end-of-turn. Afterwards it
answers such a question with some digit, any digit, about a tenth of the time each; which digit a
question wants is what RL then has to learn (`forge up --demo`, docs/dashboard.md).

    warm_up_number_answers(model_dir)   # trains the saved model in place; writes WARMUP_FILE
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from openforge.rollouts.harnesses.mini_agent import SYSTEM, TOOLS

WARMUP_FILE = "forge-warmup.json"  # beside config.json: what the model was trained on, for the record
_WORDS = ("the a file line count create write read fix edit run test json key value list number name "
          "answer done error ok data result task word folder path print how many what is sum").split()


def _example(tokenizer, rng: random.Random, digits: list[int], eos: int) -> tuple[list[int], list[int]]:  # noqa: ANN001
    question = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12))) + "? Answer with a number."
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    prompt = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=True)
    return list(prompt["input_ids"]), [rng.choice(digits), eos]


def warm_up_number_answers(model_dir: str | Path, *, steps: int = 30, batch: int = 8, lr: float = 3e-3,
                           seed: int = 0) -> dict:
    """Train the model in `model_dir` to answer number questions with one random digit; returns the record."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    digits = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    rng = random.Random(seed)
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    model.train()
    for _ in range(steps):
        examples = [_example(tokenizer, rng, digits, eos) for _ in range(batch)]
        width = max(len(p) + len(c) for p, c in examples)
        ids = torch.full((batch, width), tokenizer.pad_token_id)
        labels = torch.full((batch, width), -100)  # loss on the answer tokens only
        mask = torch.zeros((batch, width), dtype=torch.long)
        for i, (prompt, answer) in enumerate(examples):
            seq = prompt + answer
            ids[i, :len(seq)] = torch.tensor(seq)
            mask[i, :len(seq)] = 1
            labels[i, len(prompt):len(seq)] = torch.tensor(answer)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(round(loss.item(), 4))
    model.save_pretrained(str(path))
    record = {"what": "answer 'Answer with a number.' questions with one uniformly random digit",
              "steps": steps, "batch": batch, "lr": lr, "seed": seed, "loss_first_last": [losses[0], losses[-1]]}
    (path / WARMUP_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return record
