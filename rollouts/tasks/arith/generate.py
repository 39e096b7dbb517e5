"""Writes the `arith` family: two-number arithmetic a small real model sometimes gets right, in two kinds,
each with a train split and a held-out split (docs/real-model.md):

    say-train.jsonl   say-heldout.jsonl     `--tasks arith-say-train`, `--tasks arith-say-heldout`
    file-train.jsonl  file-heldout.jsonl    `--tasks arith-file-train`, `--tasks arith-file-heldout`


    python rollouts/tasks/arith/generate.py            # the shipped files (seed 0)

Every task asks for one sum, a + b with a and b from 1 to 20, answered as the full equation and
graded exactly: the whole final answer must be "a + b = c" (rollouts/tasks/grading.py; a trailing "." is
dropped, "a + b equals c" or "The answer is c" is wrong). SmolLM2-135M-Instruct through `mini` gets it right
now and then (bench/real_model.py: its base pass@1), which is what RL needs: some reward, much room. (With a
up to 99 it almost never did: 1 in 60 at temperature 1.) `say` tasks give the numbers in the instruction (an answer in one turn); `file` tasks put them in a
file the agent must read first (a tool call, then the answer: the harness is needed). All four files are disjoint by construction:
no (a, b) question appears twice, so a held-out score is a score on questions the policy never saw.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
SPLITS = {"say-train": 150, "say-heldout": 80, "file-train": 100, "file-heldout": 70}
ANSWER = ".forge/answer.txt"


def questions(seed: int) -> list[tuple[int, int]]:
    """Every (a, b) once, in a seeded order: a and b in 1..20 (400 questions)."""
    pool = [(a, b) for a in range(1, 21) for b in range(1, 21)]
    random.Random(seed).shuffle(pool)
    return pool


def task(split: str, index: int, a: int, b: int) -> dict:
    equation = f"{a} + {b} = {a + b}"
    record: dict = {"id": f"arith-{split}-{index:04d}", "difficulty": "easy", "time_limit_s": 120,
                    "expect_answer": {"text": equation},
                    "solution": f"mkdir -p .forge && printf '%s\\n' '{equation}' > {ANSWER}"}
    if split.startswith("file"):
        record |= {"instruction": ("The file numbers.txt holds two numbers, a and b, one a line. What is a + b? "
                                   "Reply with the full equation."),
                   "files": {"numbers.txt": f"{a}\n{b}\n"}, "tags": ["arith", "files"]}
    else:
        record |= {"instruction": f"What is {a} + {b}? Reply with the full equation.", "tags": ["arith"]}
    return record


def write(seed: int = 0, out: Path = HERE) -> dict[str, int]:
    pool = iter(questions(seed))
    written = {}
    for split, n in SPLITS.items():
        rows = [task(split, i, *next(pool)) for i in range(n)]
        (out / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        written[split] = len(rows)
    return written


if __name__ == "__main__":
    print(write())
