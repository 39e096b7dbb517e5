"""The demo's model warm-up: a tiny random model learns the format of a number answer (one digit,
any digit) and nothing about which digit a question wants; exact grading then has signal for GRPO."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from openforge.rollouts.harnesses.mini_agent import SYSTEM, TOOLS
from openforge.rollouts.tasks.format import load_tasks
from openforge.trainer.warmup.text import WARMUP_FILE, warm_up_number_answers


def _first_tokens(model_dir: Path, instruction: str, n: int = 200) -> Counter:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    ids = tok.apply_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": instruction}],
                                  tools=TOOLS, add_generation_prompt=True, tokenize=True)["input_ids"]
    torch.manual_seed(0)
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=torch.tensor([ids])).logits[0, -1], -1)
    return Counter(tok.decode([int(t)]) for t in torch.multinomial(probs, n, replacement=True))


@pytest.mark.slow
def test_warm_up_teaches_the_answer_format_not_the_answer(tmp_path: Path) -> None:
    from openforge.engine.tiny import LEARNABLE_NORM_GAIN, build_tiny_model

    model = build_tiny_model(tmp_path / "tiny", norm_gain=LEARNABLE_NORM_GAIN)
    sums = next(t for t in load_tasks("builtin") if t.id == "easy-sum")
    before = _first_tokens(model, sums.instruction)
    assert before["5"] < 5 and before["\n"] > 150  # the random model: a newline, almost never the digit
    record = warm_up_number_answers(model, steps=20)  # fewer than the default 30: the format is there by 20
    assert json.loads((model / WARMUP_FILE).read_text()) == record
    after = _first_tokens(model, sums.instruction)
    digits = sum(after[str(d)] for d in range(10))
    assert digits > 150, after  # it answers with a digit...
    assert max(after[str(d)] for d in range(10)) < 100, after  # ...but prefers none: 5 is still to learn
    assert after["5"] > 0
