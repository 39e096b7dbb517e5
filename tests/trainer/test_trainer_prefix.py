"""Shared-prefix training (trainer/prefix.py): rows that share a prompt prefix run it once, with the
same gradients as running every row in full."""

from __future__ import annotations

import doctest
import random
from pathlib import Path

import pytest
import torch

import openforge.trainer.prefix as prefix_mod
from openforge.config import TrainerConfig
from openforge.trainer.data import Sample, micro_batches
from openforge.trainer.grpo import StepConfig, grpo_step
from openforge.trainer.model import build_optimizer, build_policy

# fp32; the two computations differ only in float summation order: measured max |diff| / max |g| =
# 2e-7 (one epoch) and 1e-6 (two epochs, KL, seq-mean)
REL_TOL = 1e-5


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return float((a - b).abs().max()) <= REL_TOL * float(b.abs().max())


def test_docstring_examples_hold() -> None:
    result = doctest.testmod(prefix_mod)
    assert result.attempted >= 1 and result.failed == 0


def _group_samples(seed: int = 0) -> list[Sample]:
    """Two GRPO groups whose rows share a long prompt, multi-turn rows (a tool result between two
    sampled turns), a rollout with a second segment that shares only the 8-token system part, and a row that
    shares nothing. Every row has its own temperature on part of its tokens."""
    rng = random.Random(seed)
    tok = lambda n: [rng.randrange(3, 900) for _ in range(n)]  # noqa: E731
    system = tok(8)
    out: list[Sample] = []
    for g, task in enumerate(("a", "b")):
        prompt = system + tok(26)
        for k in range(4):
            c1, tool, c2 = tok(rng.randrange(2, 6)), tok(3), tok(rng.randrange(1, 5))
            ids = prompt + c1 + tool + c2
            mask = [0] * len(prompt) + [1] * len(c1) + [0] * len(tool) + [1] * len(c2)
            temps = [1.0] * len(prompt) + [0.7] * len(c1) + [1.0] * len(tool) + [1.3] * len(c2)
            logp = [-2.0 if m else 0.0 for m in mask]
            out.append(Sample(f"{task}{k}", task, 0, ids, mask, logp, rng.choice([-1.0, 0.5, 1.0]), 0.0, temps))
        # rollout a1/b1 also has a second segment (the harness compacted its history)
        ids = system + tok(4) + tok(3)
        out.append(Sample(f"{task}1", task, 1, ids, [0] * 12 + [1] * 3, [0.0] * 12 + [-1.5] * 3, out[-3].advantage, 0.0))
    loner = tok(9)
    out.append(Sample("c0", "c", 0, loner, [0] * 5 + [1] * 4, [0.0] * 5 + [-3.0] * 4, 1.0, 0.0))
    return out


def _grads(tiny_model: Path, mbs: list[dict[str, torch.Tensor]], step: StepConfig) -> tuple[torch.Tensor, dict]:
    cfg = TrainerConfig(lr=1e-2, lora_r=4, lora_alpha=8, seed=0)
    torch.manual_seed(0)
    model = build_policy(tiny_model, cfg, device=torch.device("cpu"))
    with torch.no_grad():  # a non-zero B: every LoRA weight (the prefix's k/v ones too) gets a gradient
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
    opt, _ = build_optimizer(model, cfg)
    for g in opt.param_groups:  # lr 0: compare the accumulated gradients, not the update
        g["lr"] = 0.0
    metrics = grpo_step(model, opt, mbs, step)
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]), metrics


@pytest.mark.parametrize("step", [StepConfig(max_grad_norm=1e9),
                                  StepConfig(max_grad_norm=1e9, epochs=2, kl_coef=0.1, loss_agg="seq-mean")],
                         ids=["one-epoch", "two-epochs-kl-seq-mean"])
def test_shared_prefix_gradients_equal_the_unshared_ones(tiny_model: Path, step: StepConfig) -> None:
    samples = _group_samples()
    kw = dict(pad_id=0, loss_agg=step.loss_agg, token_budget=24)
    plain = micro_batches(samples, share_prefix_min=0, **kw)
    shared = micro_batches(samples, share_prefix_min=16, **kw)
    prefixes = {int(mb["prefix_id"]): int(mb["prefix_ids"].numel()) for mb in shared if "prefix_id" in mb}
    # each group shares its 34-token prompt (the prefix stops one short, at the first sampled token's
    # predictor); the compacted segments (8 common tokens < 16) and the loner run in full
    assert sorted(prefixes.values()) == [33, 33]
    assert sum(1 for mb in shared if "prefix_id" in mb) > len(prefixes)  # a unit spans several micro-batches
    assert sum(int(mb["input_ids"].numel()) for mb in shared) < sum(int(mb["input_ids"].numel()) for mb in plain)

    g_plain, m_plain = _grads(tiny_model, plain, step)
    g_shared, m_shared = _grads(tiny_model, shared, step)
    assert g_plain.abs().min() >= 0 and (g_plain != 0).float().mean() > 0.9  # nearly every weight has a gradient
    assert _close(g_shared, g_plain), float((g_shared - g_plain).abs().max() / g_plain.abs().max())
    assert m_shared["n_tokens"] == m_plain["n_tokens"]
    assert m_shared["loss"] == pytest.approx(m_plain["loss"], rel=1e-5)
    assert m_shared["mismatch_mean"] == pytest.approx(m_plain["mismatch_mean"], rel=1e-5)


def test_a_detached_prefix_would_be_caught(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above can fail: the usual shortcut (prefix K/V computed without a graph, so no
    gradient flows into the prefix) gives measurably different gradients."""
    import openforge.trainer.grpo as grpo

    samples = _group_samples()
    plain = micro_batches(samples, share_prefix_min=0, pad_id=0, loss_agg="token-mean", token_budget=24)
    shared = micro_batches(samples, share_prefix_min=16, pad_id=0, loss_agg="token-mean", token_budget=24)
    g_plain, _ = _grads(tiny_model, plain, StepConfig(max_grad_norm=1e9))
    real = prefix_mod.shared_prefix
    monkeypatch.setattr(grpo, "shared_prefix", lambda model, mb, grad, **kw: real(model, mb, grad=False, **kw))
    g_cut, _ = _grads(tiny_model, shared, StepConfig(max_grad_norm=1e9))
    assert not _close(g_cut, g_plain)


def test_rows_that_share_too_little_are_not_grouped() -> None:
    samples = _group_samples()
    units = prefix_mod.shared_prefixes(samples, 1000)
    assert units == [(0, list(units[0][1]))] and sorted(units[0][1]) == list(range(len(samples)))


def _two_level_samples(seed: int = 1) -> list[Sample]:
    """A harness's shape: every task's prompt opens with the same long system part, then each task's
    own part; each group's rows differ only in their answers."""
    rng = random.Random(seed)
    tok = lambda n: [rng.randrange(3, 900) for _ in range(n)]  # noqa: E731
    system = tok(80)  # long enough that one unit of all nine rows saves most: 8 x 80 > 3 x 2 x 100
    out: list[Sample] = []
    for task in ("a", "b", "c"):
        prompt = system + tok(20)
        for k in range(3):
            answer = tok(rng.randrange(1, 4))
            ids, mask = prompt + answer, [0] * len(prompt) + [1] * len(answer)
            out.append(Sample(f"{task}{k}", task, 0, ids, mask, [-2.0 if m else 0.0 for m in mask],
                              rng.choice([-1.0, 0.5, 1.0]), 0.0, None))
    return out


def test_a_prefix_inside_a_shared_prefix_runs_once_with_exact_gradients(tiny_model: Path) -> None:
    samples = _two_level_samples()
    step = StepConfig(max_grad_norm=1e9)
    kw = dict(pad_id=0, loss_agg=step.loss_agg, token_budget=128)
    plain = micro_batches(samples, share_prefix_min=0, **kw)
    nested = micro_batches(samples, share_prefix_min=16, **kw)
    assert {int(mb["prefix_ids"].numel()) for mb in nested} == {80}  # the system part, for all nine rows
    assert sorted({(int(mb["prefix2_id"]), int(mb["prefix2_ids"].numel())) for mb in nested}) == \
        [(1, 19), (2, 19), (3, 19)]  # each task's own part, once per group (up to its last prompt token)
    assert max(int(mb["input_ids"].shape[1]) for mb in nested) <= 4  # rows hold that token + their answers
    g_plain, m_plain = _grads(tiny_model, plain, step)
    g_nested, m_nested = _grads(tiny_model, nested, step)
    assert _close(g_nested, g_plain), float((g_nested - g_plain).abs().max() / g_plain.abs().max())
    assert m_nested["loss"] == pytest.approx(m_plain["loss"], rel=1e-5)
    assert m_nested["mismatch_mean"] == pytest.approx(m_plain["mismatch_mean"], rel=1e-5)
