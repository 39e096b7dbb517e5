"""GRPO math on tiny hand-computed cases."""

from __future__ import annotations

import doctest
import math

import pytest
import torch

import openforge.trainer.grpo as grpo
from openforge.errors import TrainerError
from openforge.trainer.grpo import aggregation_weights, group_advantages, lr_lambda, policy_loss
from tests.helpers.trainer import _FixedLogits


def test_docstring_examples_hold() -> None:
    result = doctest.testmod(grpo)
    assert result.attempted >= 4 and result.failed == 0


def test_group_advantages_by_hand() -> None:
    # rewards 2, 0, 1: mean 1, unbiased std 1 -> (1, -1, 0)
    adv = group_advantages(torch.tensor([2.0, 0.0, 1.0]), eps=0.0)
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, 0.0]))
    # Dr. GRPO: centred only
    adv = group_advantages(torch.tensor([2.0, 0.0, 1.0]), std_normalize=False)
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, 0.0]))
    adv = group_advantages(torch.tensor([3.0, 1.0]), std_normalize=False)
    assert torch.allclose(adv, torch.tensor([1.0, -1.0]))


def test_group_advantages_grouped_rows_and_flat_group() -> None:
    adv = group_advantages(torch.tensor([[1.0, 0.0], [5.0, 5.0]]))
    assert adv[1].abs().max() == 0  # all-equal group: nothing to learn
    assert adv[0, 0] > 0 > adv[0, 1]
    assert torch.allclose(adv[0].sum(), torch.tensor(0.0))


def test_policy_loss_value_and_gradient_by_hand() -> None:
    # Two tokens of one sequence, A = +1. First epoch: proximal = new, so r = 1.
    # TIS weights: exp(log .6 - log .5) = 1.2 and exp(log .9 - log .3) = 3 -> capped at 2.
    lp = torch.log(torch.tensor([[0.6, 0.9]])).requires_grad_()
    old = torch.log(torch.tensor([[0.5, 0.3]]))
    out = policy_loss(lp, old, torch.tensor([1.0]), torch.ones(1, 2), tis_cap=2.0)
    # token-mean: -(1.2 + 2.0) / 2
    assert out.loss.item() == pytest.approx(-1.6)
    out.loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-0.6, -1.0]]))
    assert out.tis_frac == pytest.approx(0.5)
    assert out.clip_frac == 0.0


def test_policy_loss_clips_outside_the_trust_region() -> None:
    # proximal log 0.5, new log 0.8: r = 1.6 > 1.2. With A > 0 the clipped branch (1.2 A) wins and
    # carries no gradient; with A < 0 the unclipped branch (-r A) is the max and keeps its gradient.
    old = torch.log(torch.tensor([[0.5]]))
    for adv, expect_loss, expect_grad in ((1.0, -1.2, 0.0), (-1.0, 1.6, 1.6)):
        lp = torch.log(torch.tensor([[0.8]])).requires_grad_()
        out = policy_loss(lp, old, torch.tensor([adv]), torch.ones(1, 1), logp_proximal=old.clone())
        out.loss.backward()
        assert out.loss.item() == pytest.approx(expect_loss, rel=1e-5)
        assert lp.grad.item() == pytest.approx(expect_grad, rel=1e-5)
    assert policy_loss(torch.log(torch.tensor([[0.8]])), old, torch.tensor([1.0]), torch.ones(1, 1),
                       logp_proximal=old).clip_frac == 1.0


def test_asymmetric_clip_high() -> None:
    old = torch.log(torch.tensor([[0.5]]))
    lp = torch.log(torch.tensor([[0.65]]))  # r = 1.3
    low = policy_loss(lp, old, torch.tensor([1.0]), torch.ones(1, 1), logp_proximal=old, clip_eps=0.2)
    high = policy_loss(lp, old, torch.tensor([1.0]), torch.ones(1, 1), logp_proximal=old, clip_eps=0.2,
                       clip_eps_high=0.28)
    assert low.loss.item() == pytest.approx(-1.2)
    assert high.loss.item() == pytest.approx(-1.28)


def test_only_mask_tokens_get_loss() -> None:
    lp = torch.log(torch.tensor([[0.5, 0.1, 0.4]])).requires_grad_()
    mask = torch.tensor([[0.0, 1.0, 0.0]])
    out = policy_loss(lp, lp.detach(), torch.tensor([2.0]), mask)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-2.0)
    assert lp.grad[0, 0] == 0 and lp.grad[0, 2] == 0 and lp.grad[0, 1] == pytest.approx(-2.0)


def test_k3_kl_by_hand() -> None:
    # ref - new = log(0.5/0.25) = log 2: k3 = 2 - log 2 - 1
    lp = torch.log(torch.tensor([[0.25]])).requires_grad_()
    ref = torch.log(torch.tensor([[0.5]]))
    out = policy_loss(lp, lp.detach(), torch.tensor([0.0]), torch.ones(1, 1), logp_ref=ref, kl_coef=0.1)
    k3 = 2 - math.log(2) - 1
    assert out.kl == pytest.approx(k3, rel=1e-5)
    assert out.loss.item() == pytest.approx(0.1 * k3, rel=1e-5)
    same = policy_loss(ref.clone(), ref, torch.tensor([0.0]), torch.ones(1, 1), logp_ref=ref, kl_coef=1.0)
    assert same.kl == pytest.approx(0.0, abs=1e-7)


def test_aggregation_token_vs_sequence_mean() -> None:
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    tok = aggregation_weights(mask, "token-mean")
    assert torch.allclose(tok, torch.full_like(mask, 0.25))
    seq = aggregation_weights(mask, "seq-mean")
    assert seq[0, 0].item() == pytest.approx(1 / 6) and seq[1, 0].item() == pytest.approx(1 / 2)
    # two rows of one rollout (segments) count as one sequence of 4 tokens
    joined = aggregation_weights(mask, "seq-mean", torch.tensor([7, 7]))
    assert torch.allclose(joined, torch.full_like(mask, 0.25))
    lp = torch.zeros(2, 3)
    loss = policy_loss(lp, lp, torch.tensor([1.0, -1.0]), mask, loss_agg="seq-mean").loss
    assert loss.item() == pytest.approx(0.0)  # -(1*1)/2 + (1*1)/2
    with pytest.raises(TrainerError, match="loss_agg"):
        aggregation_weights(mask, "sum")


def test_lr_schedules() -> None:
    assert [lr_lambda("constant", total_steps=3, warmup_steps=1)(n) for n in range(3)] == [1.0, 1.0, 1.0]
    cos = lr_lambda("cosine", total_steps=4)
    assert cos(0) == 1.0 and cos(2) == pytest.approx(0.5) and cos(4) == pytest.approx(0.0)
    with pytest.raises(TrainerError):
        lr_lambda("step", total_steps=1)


def test_token_logprobs_skips_the_prompt_exactly(tiny_model) -> None:
    from transformers import AutoModelForCausalLM

    from openforge.trainer.grpo import token_logprobs

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32).eval()
    ids = torch.tensor([[5, 9, 33, 70, 2, 8, 41], [7, 7, 12, 90, 4, 0, 0]])
    attn = torch.tensor([[1] * 7, [1] * 5 + [0, 0]])
    with torch.no_grad():
        full = token_logprobs(model, ids, attn)
        part = token_logprobs(model, ids, attn, first=4)
        logits = model(input_ids=ids, attention_mask=attn).logits
    ref = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    assert full.shape == part.shape == (2, 6)
    assert torch.allclose(full, ref, atol=1e-5)
    assert torch.allclose(part[:, 3:], ref[:, 3:], atol=1e-5)  # targets 4..6
    assert (part[:, :3] == 0).all()


def test_entropy_bonus_in_the_loss_by_hand() -> None:
    # One token, first epoch (r = 1), engine logprob = trainer logprob (w = 1), A = 1: L_pg = -1.
    # With H = 0.5 and alpha_H = 0.1 the loss is -1 - 0.1 * 0.5 = -1.05, and dL/dH = -0.1.
    lp = torch.log(torch.tensor([[0.6]]))
    ent = torch.tensor([[0.5]], requires_grad=True)
    out = policy_loss(lp, lp.clone(), torch.tensor([1.0]), torch.ones(1, 1), entropy=ent, entropy_coef=0.1)
    assert out.loss.item() == pytest.approx(-1.05)
    out.loss.backward()
    assert ent.grad.item() == pytest.approx(-0.1)
    assert out.entropy == pytest.approx(0.5)
    masked = policy_loss(lp.expand(1, 2), lp.expand(1, 2).clone(), torch.tensor([1.0]), torch.tensor([[1.0, 0.0]]),
                         entropy=torch.tensor([[0.5, 9.0]]), entropy_coef=0.1)
    assert masked.loss.item() == pytest.approx(-1.05) and masked.entropy == pytest.approx(0.5)  # prompt tokens: none


def _entropy(p: list[float]) -> float:
    return -sum(q * math.log(q) for q in p)


def test_token_entropy_by_hand_at_the_call_temperature() -> None:
    # z = (0, ln 3): p = (1/4, 3/4), H = 0.5623; at temperature 2, p = (1, sqrt 3) / (1 + sqrt 3)
    model = _FixedLogits([0.0, math.log(3.0)])
    ids, att = torch.tensor([[0, 1, 1]]), torch.ones(1, 3, dtype=torch.long)
    logp, ent = grpo.token_logprobs(model, ids, att, entropy=True)
    assert ent.shape == logp.shape == (1, 2)
    assert ent[0, 1].item() == pytest.approx(_entropy([0.25, 0.75]), rel=1e-6)
    assert logp[0, 1].item() == pytest.approx(math.log(0.75), rel=1e-6)
    s3 = math.sqrt(3.0)
    _, hot = grpo.token_logprobs(model, ids, att, temperature=2.0, entropy=True)
    assert hot[0, 1].item() == pytest.approx(_entropy([1 / (1 + s3), s3 / (1 + s3)]), rel=1e-6)
    assert torch.equal(grpo.token_logprobs(model, ids, att), logp)  # without entropy: the logprobs alone


def test_grpo_step_with_entropy_coef_moves_the_policy_up_its_entropy_gradient() -> None:
    # Zero advantage: the policy-gradient term is 0, so one SGD step (lr 1) moves z by
    # alpha_H * dH/dz, dH/dz_i = -p_i (log p_i + H): with p = (1/4, 3/4), +-0.2060 each.
    p, coef = [0.25, 0.75], 0.1
    H = _entropy(p)
    model = _FixedLogits([0.0, math.log(3.0)])
    mb = {"input_ids": torch.tensor([[0, 1]]), "attention_mask": torch.ones(1, 2, dtype=torch.long),
          "mask": torch.ones(1, 1), "old_logp": torch.log(torch.tensor([[0.75]])), "weights": torch.ones(1, 1),
          "advantages": torch.zeros(1), "first": torch.tensor(1)}
    cfg = grpo.StepConfig(entropy_coef=coef, max_grad_norm=1e9)
    metrics = grpo.grpo_step(model, torch.optim.SGD(model.parameters(), lr=1.0), [mb], cfg)
    assert metrics["entropy"] == pytest.approx(H, rel=1e-6)
    assert metrics["loss"] == pytest.approx(-coef * H, rel=1e-6)
    grad = [-q * (math.log(q) + H) for q in p]
    assert model.z.detach().tolist() == pytest.approx([coef * grad[0], math.log(3.0) + coef * grad[1]], rel=1e-5)
    plain = _FixedLogits([0.0, math.log(3.0)])
    assert "entropy" not in grpo.grpo_step(plain, torch.optim.SGD(plain.parameters(), lr=1.0), [mb],
                                           grpo.StepConfig(max_grad_norm=1e9))
    assert plain.z.detach().tolist() == pytest.approx([0.0, math.log(3.0)])  # no bonus, no advantage: no move
