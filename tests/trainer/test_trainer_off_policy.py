"""trainer/off_policy.py: TIS caps a token's engine/trainer ratio, MIS and IcePop drop the token; the step
reports how many it dropped and the engine/trainer mismatch (mean k3 KL, max ratio), on hand-computed cases."""

from __future__ import annotations

import doctest
import math

import pytest
import torch

import openforge.trainer.off_policy as off_policy
from openforge.config import load_config
from openforge.errors import ConfigError, TrainerError
from openforge.trainer.grpo import StepConfig, grpo_step, policy_loss
from tests.helpers.trainer import _FixedLogits


def test_docstring_examples_hold() -> None:
    result = doctest.testmod(off_policy)
    assert result.attempted >= 3 and result.failed == 0


# Three tokens of one sequence, A = +1, first epoch (r = 1), token-mean (1/3 each). The trainer's
# probabilities 0.6, 0.5, 0.4 against the engine's 0.6, 0.0005, 4.0 (log 4 is impossible for a real
# engine; here it just makes rho = 0.1): rho = 1, 1000, 0.1.
TRAINER = [0.6, 0.5, 0.4]
ENGINE = [0.6, 0.0005, 4.0]


@pytest.mark.parametrize("mode, weights, masked", [
    ("tis", [1.0, 2.0, 0.1], 0),       # the huge ratio is capped at C = 2: its token still pulls
    ("mis", [1.0, 0.0, 0.1], 1),       # dropped above C; the small ratio is kept as it is
    ("icepop", [1.0, 0.0, 0.0], 2),    # dropped on both sides of [0.5, 5]
    ("none", [1.0, 1.0, 1.0], 0),
])
def test_a_token_of_huge_ratio_is_capped_by_tis_and_dropped_by_mis_and_icepop(mode: str, weights: list[float],
                                                                               masked: int) -> None:
    lp = torch.log(torch.tensor([TRAINER])).requires_grad_()
    out = policy_loss(lp, torch.log(torch.tensor([ENGINE])), torch.tensor([1.0]), torch.ones(1, 3), tis_cap=2.0,
                      off_policy=mode)
    out.loss.backward()
    # dL/dlogp_t = -w_t * A * r / 3 with r = 1
    assert lp.grad[0].tolist() == pytest.approx([-w / 3 for w in weights], rel=1e-5)
    assert out.masked == masked
    assert out.tis_frac == pytest.approx(1 / 3 if mode == "tis" else 0.0)


def test_a_dropped_token_leaves_the_loss_but_not_its_denominator() -> None:
    lp = torch.log(torch.tensor([TRAINER])).requires_grad_()
    out = policy_loss(lp, torch.log(torch.tensor([ENGINE])), torch.tensor([1.0]), torch.ones(1, 3), off_policy="mis")
    assert out.loss.item() == pytest.approx(-(1.0 + 0.1) / 3, rel=1e-5)  # token-mean over all 3 tokens


def test_an_unknown_mode_is_an_error() -> None:
    with pytest.raises(TrainerError, match="unknown off_policy 'tiss'"):
        off_policy.off_policy_weights(torch.ones(2), "tiss")


def _batch(engine: list[float], mask: list[float]) -> dict[str, torch.Tensor]:
    # tokens 1, 0, 1 predicted after 0, 1, 0; the model's p = (1/4, 3/4) at every position
    return {"input_ids": torch.tensor([[0, 1, 0, 1]]), "attention_mask": torch.ones(1, 4, dtype=torch.long),
            "mask": torch.tensor([mask]), "old_logp": torch.log(torch.tensor([engine])),
            "weights": torch.full((1, 3), 1 / 3), "advantages": torch.ones(1), "first": torch.tensor(1)}


def _step(mb: dict[str, torch.Tensor], mode: str) -> tuple[dict[str, float], list[float]]:
    model = _FixedLogits([0.0, math.log(3.0)])
    metrics = grpo_step(model, torch.optim.SGD(model.parameters(), lr=1.0), [mb],
                        StepConfig(off_policy=mode, max_grad_norm=1e9))
    return metrics, model.z.detach().tolist()


def test_the_step_reports_the_mismatch_and_the_masked_count_and_trains_without_the_dropped_token() -> None:
    # trainer: 3/4, 1/4, 3/4; engine: 3/4, 1/400, 1/2 -> rho = 1, 100, 1.5
    engine = [0.75, 0.0025, 0.5]
    rho = [1.0, 100.0, 1.5]
    mis, z_mis = _step(_batch(engine, [1.0, 1.0, 1.0]), "mis")
    assert mis["masked_tokens"] == 1 and mis["n_tokens"] == 3
    assert mis["mismatch_kl"] == pytest.approx(sum(r - 1 - math.log(r) for r in rho) / 3, rel=1e-5)
    assert mis["mismatch_ratio_max"] == pytest.approx(100.0, rel=1e-5)
    assert mis["mismatch_mean"] == pytest.approx(sum(math.log(r) for r in rho) / 3, rel=1e-5)
    # the dropped token moved nothing: the same update as a batch where it is not trained at all
    _, z_without = _step(_batch(engine, [1.0, 0.0, 1.0]), "mis")
    assert z_mis == pytest.approx(z_without, rel=1e-6)
    tis, z_tis = _step(_batch(engine, [1.0, 1.0, 1.0]), "tis")
    assert tis["masked_tokens"] == 0 and tis["tis_frac"] == pytest.approx(1 / 3)
    assert tis["mismatch_kl"] == pytest.approx(mis["mismatch_kl"])  # measured the same whatever corrects it
    assert z_tis != pytest.approx(z_without, rel=1e-3)  # under TIS the token pulls, capped at 2
    icepop, z_ice = _step(_batch(engine, [1.0, 1.0, 1.0]), "icepop")
    assert icepop["masked_tokens"] == 1 and z_ice == pytest.approx(z_without, rel=1e-6)  # 1.5 is inside [0.5, 5]


def test_the_config_picks_the_correction_and_refuses_a_band_without_one() -> None:
    cfg = load_config(overrides={"trainer": {"off_policy": "icepop", "icepop_band": [0.25, 4.0]}}).trainer
    step = StepConfig.from_trainer(cfg, None)
    assert (step.off_policy, step.icepop_band) == ("icepop", (0.25, 4.0))
    assert StepConfig.from_trainer(load_config().trainer, None).off_policy == "tis"  # the default is unchanged
    with pytest.raises(ConfigError, match=r"icepop_band \[1.5, 4.0\]: needs 0 < low < 1 < high"):
        load_config(overrides={"trainer": {"icepop_band": [1.5, 4.0]}})
    with pytest.raises(ConfigError, match="off_policy"):
        load_config(overrides={"trainer": {"off_policy": "clip"}})
