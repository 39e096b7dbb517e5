"""The demo's model warm-up: a tiny random model learns the format of a number answer (one digit,
any digit; on the demo's questions one of the digits they name) and nothing about which digit a
question wants; exact grading then has signal for GRPO."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from openforge.rollouts.harnesses.mini_agent import SYSTEM, TOOLS
from openforge.rollouts.tasks.format import load_tasks
from openforge.trainer.warmup.text import DEMO_TAG, WARMUP_FILE, warm_up_number_answers

N = 400


def _first_tokens(model_dir: Path, instruction: str, n: int = N) -> Counter:
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
    tasks = load_tasks("builtin")
    sums = next(t for t in tasks if t.id == "easy-sum")
    demo = [t for t in tasks if DEMO_TAG in t.tags]
    answers = {f"{t.expect_answer.number:g}" for t in demo}
    assert len(demo) >= 2 and len(answers) == len(demo)  # k tasks, k different answers: blind ceiling 1/k
    before = _first_tokens(model, sums.instruction)
    assert before["5"] < 10 and before["\n"] > 0.75 * N  # the random model: a newline, almost never the digit
    record = warm_up_number_answers(model)  # what `forge up` runs (runs/prepare.py)
    assert json.loads((model / WARMUP_FILE).read_text()) == record

    after = _first_tokens(model, sums.instruction)
    assert sum(after[str(d)] for d in range(10)) > 0.75 * N, after  # it answers with a digit...
    assert 0 < after["5"] <= 2 * N / 10, after  # ...and not the right one more than twice uniform's share

    # The demo's questions: one of their named answers, with the same odds whichever question it is.
    # A warm-up that taught the answer would make the right digit likelier on its own question.
    seen = {t.id: _first_tokens(model, t.instruction) for t in demo}
    for t in demo:
        assert sum(seen[t.id][a] for a in answers) > 0.75 * N, seen  # answers in the format...
        assert seen[t.id][f"{t.expect_answer.number:g}"] > 0, seen  # ...the right one among them
    for a in answers:
        shares = [seen[t.id][a] for t in demo]
        assert max(shares) - min(shares) < 0.1 * N, (a, seen)  # blind to the question


@pytest.mark.slow
def test_a_tiny_model_warmed_up_for_an_older_demo_is_rebuilt(tmp_path: Path) -> None:
    from openforge.config import ForgeConfig
    from openforge.engine.tiny import build_tiny_model
    from openforge.paths import default_tiny_model
    from openforge.runs.prepare import resolve_model
    from openforge.trainer.warmup.text import is_warmed_up

    path = default_tiny_model(tmp_path)
    build_tiny_model(path)
    (path / WARMUP_FILE).write_text(json.dumps({"what": "the warm-up before the digit demo", "steps": 30}))
    assert not is_warmed_up(path)
    assert resolve_model(ForgeConfig(), tmp_path) == path
    assert is_warmed_up(path) and not path.with_name("tiny.partial").exists()
    record = json.loads((path / WARMUP_FILE).read_text())
    assert record["demo_answers"] == sorted({f"{t.expect_answer.number:g}" for t in load_tasks("builtin")
                                             if DEMO_TAG in t.tags})
