"""Packed SFT rows (trainer/packing.py) on the tiny Qwen2 model: the packed loss and gradients equal
each sequence trained alone, and no token attends to another sequence of its row."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from openforge.config import TrainerConfig
from openforge.trainer.packing import pack, packed_nll, packed_row
from openforge.trainer.sft import Example, evaluate_loss, train_sft

pytestmark = pytest.mark.timeout(300)
CPU = torch.device("cpu")


def model_of(tiny_model: Path):  # noqa: ANN201
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    model.train()  # dropout is 0 in the tiny config; train mode is what SFT runs in
    return model


def hand_made(vocab: int) -> list[Example]:
    """Sequences of different lengths, each a prompt (mask 0) then assistant spans (mask 1), one of
    them two turns with a tool result between."""
    g = torch.Generator().manual_seed(7)

    def ids(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=g).tolist()

    shapes = [[(0, 9), (1, 5)], [(0, 4), (1, 3)], [(0, 12), (1, 6), (0, 5), (1, 4)], [(0, 2), (1, 1)],
              [(0, 7), (1, 10)]]
    out = []
    for i, spans in enumerate(shapes):
        mask = [m for m, n in spans for _ in range(n)]
        out.append(Example(rollout_id=f"r{i}", task_id=f"t{i}", token_ids=ids(len(mask)), loss_mask=mask))
    return out


def alone_nll(model, e: Example) -> torch.Tensor:  # noqa: ANN001
    """Sum of -log p of e's masked tokens, e in a forward pass of its own (no padding, no packing)."""
    ids = torch.tensor([e.token_ids])
    logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
    lp = logp.gather(-1, ids[0, 1:, None]).squeeze(-1)
    return -(lp * torch.tensor(e.loss_mask[1:], dtype=torch.float32)).sum()


def grads(model) -> dict[str, torch.Tensor]:  # noqa: ANN001
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def test_packing_fits_rows_first_fit_and_marks_only_in_sequence_targets() -> None:
    examples = hand_made(100)
    rows = pack(examples, max_tokens=40)
    assert sorted(i for row in rows for i in row) == list(range(5))
    assert all(sum(len(examples[i].token_ids) for i in row) <= 40 for row in rows)
    row = packed_row([examples[1], examples[3]])
    assert row.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 6, 0, 1, 2]]
    # Targets are tokens 1.. of the row: the 3 answer tokens of the first, and not the second's first
    # token (it follows another sequence); its one answer token is the row's last.
    assert row.targets.tolist() == [False, False, False, True, True, True, False, False, True]
    assert row.n_targets == 4 and row.n_sequences == 2
    assert pack([examples[2]], max_tokens=8) == [[0]]  # longer than a row: a row alone


def test_packed_loss_and_gradients_equal_each_sequence_alone(tiny_model: Path) -> None:
    model = model_of(tiny_model)
    examples = hand_made(model.config.vocab_size)
    n_targets = sum(sum(e.loss_mask[1:]) for e in examples)

    model.zero_grad()
    reference = sum(alone_nll(model, e) for e in examples) / n_targets
    reference.backward()
    expected = grads(model)

    model.zero_grad()
    row = packed_row(examples)
    assert row.n_targets == n_targets
    packed = packed_nll(model, row, CPU) / row.n_targets
    packed.backward()
    got = grads(model)

    assert abs(float(packed.detach()) - float(reference.detach())) < 1e-5
    assert got.keys() == expected.keys() and len(got) > 10
    for name, g in expected.items():
        torch.testing.assert_close(got[name], g, rtol=1e-4, atol=1e-6, msg=name)
    # evaluate_loss packs the same way, into however many rows max_tokens allows.
    with torch.no_grad():
        for max_tokens in (20, 4096):
            assert abs(evaluate_loss(model, examples, max_tokens=max_tokens, device=CPU) - float(reference)) < 1e-5


def per_token_logprobs(model, row) -> torch.Tensor:  # noqa: ANN001
    """log p of every token of the row given what precedes it in the forward pass."""
    ids = row.input_ids
    logits = model(input_ids=ids, position_ids=row.position_ids, attention_mask=None, use_cache=False).logits[0, :-1]
    return torch.log_softmax(logits.float(), -1).gather(-1, ids[0, 1:, None]).squeeze(-1)


@torch.no_grad()
def test_attention_does_not_cross_sequences_in_a_packed_row(tiny_model: Path) -> None:
    model = model_of(tiny_model)
    a, b, *_ = hand_made(model.config.vocab_size)
    other_a = Example("x", "x", [(t * 7 + 11) % model.config.vocab_size for t in a.token_ids], a.loss_mask)
    n = len(a.token_ids)

    b_after_a = per_token_logprobs(model, packed_row([a, b]))[n:]  # b's tokens 1.. (index n-1 is b's first)
    b_after_other = per_token_logprobs(model, packed_row([other_a, b]))[n:]
    torch.testing.assert_close(b_after_a, b_after_other, rtol=0, atol=1e-6)  # b never sees a
    alone = per_token_logprobs(model, packed_row([b]))
    torch.testing.assert_close(b_after_a, alone, rtol=0, atol=1e-5)

    # The same check would catch a leak: b after a in one causal sequence (what packing without the
    # per-sequence mask would compute) does depend on what a holds.
    flat = torch.tensor([a.token_ids + b.token_ids])
    flat_other = torch.tensor([other_a.token_ids + b.token_ids])
    leaked = torch.log_softmax(model(input_ids=flat).logits[0, n:-1].float(), -1)
    leaked_other = torch.log_softmax(model(input_ids=flat_other).logits[0, n:-1].float(), -1)
    assert (leaked - leaked_other).abs().max() > 1e-3


def test_a_step_trains_on_packed_rows_of_max_tokens(store, tiny_model: Path, forge_home: Path) -> None:
    from transformers import AutoConfig

    examples = hand_made(AutoConfig.from_pretrained(str(tiny_model)).vocab_size)
    run = store.create_run(kind="sft")
    result = train_sft(store, forge_home, run.id, model_path=tiny_model, examples=examples,
                       cfg=TrainerConfig(device="cpu", lr=1e-3), epochs=2, max_tokens=40)
    steps = store.list_train_steps(run.id)
    assert len(steps) == result.steps
    assert all(s.n_tokens <= 40 for s in steps)  # every example here fits a row
    per_epoch = [sum(s.metrics_json["sequences"] for s in steps if s.metrics_json["epoch"] == e) for e in (0, 1)]
    assert per_epoch == [5, 5]
    assert any(s.metrics_json["sequences"] > 1 for s in steps)  # rows really hold several sequences


def test_packing_docstring_examples() -> None:
    import doctest

    from openforge.trainer import packing

    result = doctest.testmod(packing)
    assert result.attempted > 0 and result.failed == 0
