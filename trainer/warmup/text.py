"""A short supervised warm-up that teaches a tiny model the *format* of a number answer, not the answer.

The tiny random model (engine/tiny.py) answers a prompt in the `mini` harness's format with a newline
95% of the time and any one token about 0.1% of the time: under exact grading no group of 8 ever
holds a right answer, so GRPO has nothing to reinforce. This warm-up trains it for a few seconds on
`mini`-format prompts (its system prompt and tools) built from random words and ending in
"Answer with a number.", each answered by a uniformly random digit and end-of-turn. Afterwards it
answers such a question with some digit, any digit, about a tenth of the time each.

Half of every batch is the demo's own questions (the built-in tasks tagged `demo`, which name their
possible answers): each answered with each of the demo's answers equally often, the answer drawn
independently of the question, as trainer/warmup/gui.py does for the GUI demo's screens. So every
demo question starts at about 1/k right for k answers, the blind policy's ceiling, and every GRPO
group holds right and wrong answers; which answer a question wants is what RL then has to learn
(`forge up --demo`, docs/dashboard.md). Without this half the groups of the task whose digit the
policy did not pick first stay all wrong, and the demo learnt one digit for every question.

    warm_up_number_answers(model_dir)   # trains the saved model in place; writes WARMUP_FILE
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from openforge.rollouts.harnesses.mini_agent import SYSTEM, TOOLS
from openforge.rollouts.tasks.format import load_tasks

WARMUP_FILE = "forge-warmup.json"  # beside config.json: what the model was trained on, for the record
_WORDS = ("the a file line count create write read fix edit run test json key value list number name "
          "answer done error ok data result task word folder path print how many what is sum").split()


DEMO_TAG = "demo"


def _prompt(tokenizer, question: str) -> list[int]:  # noqa: ANN001
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return list(tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=True)["input_ids"])


def _example(tokenizer, rng: random.Random, digits: list[int], eos: int) -> tuple[list[int], list[int]]:  # noqa: ANN001
    question = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12))) + "? Answer with a number."
    return _prompt(tokenizer, question), [rng.choice(digits), eos]


def demo_questions() -> dict[str, str]:
    """The demo's questions and the one-token answer each wants: {instruction: answer text}."""
    return {t.instruction: f"{t.expect_answer.number:g}" for t in load_tasks("builtin") if DEMO_TAG in t.tags}


def _demo_examples(tokenizer, rng: random.Random, n: int, eos: int) -> list[tuple[list[int], list[int]]]:  # noqa: ANN001
    """n examples of the demo's questions, each answer equally often, each question drawn on its own."""
    questions = list(demo_questions())
    answers = [tokenizer.convert_tokens_to_ids(a) for a in demo_questions().values()]
    said = answers * (n // len(answers))
    rng.shuffle(said)
    return [(_prompt(tokenizer, rng.choice(questions)), [a, eos]) for a in said]


def is_warmed_up(model_dir: str | Path) -> bool:
    """Whether `model_dir` holds this warm-up for today's demo questions (a model warmed up for an older
    demo would answer today's questions blind to them)."""
    try:
        record = json.loads((Path(model_dir) / WARMUP_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("demo_answers") == sorted(set(demo_questions().values()))


def warm_up_number_answers(model_dir: str | Path, *, steps: int = 30, batch: int = 8, lr: float = 3e-3,
                           seed: int = 0) -> dict:
    """Train the model in `model_dir` to answer number questions with one random digit, and the demo's
    questions with one of their answers, independent of the question; returns the record."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    digits = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    n_demo = batch // 2
    if n_demo % len(demo_questions()):
        raise ValueError(f"half of batch {batch} does not split evenly over {len(demo_questions())} demo answers")
    rng = random.Random(seed)
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    model.train()
    for _ in range(steps):
        examples = ([_example(tokenizer, rng, digits, eos) for _ in range(batch - n_demo)]
                    + _demo_examples(tokenizer, rng, n_demo, eos))
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
    record = {"what": "answer 'Answer with a number.' questions with one uniformly random digit, "
                      "and the demo's questions with one of their answers, independent of the question",
              "demo_answers": sorted(set(demo_questions().values())),
              "steps": steps, "batch": batch, "lr": lr, "seed": seed, "loss_first_last": [losses[0], losses[-1]]}
    (path / WARMUP_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return record
