"""The engine/trainer gap of each sampled token: how the loss corrects for it and how a step measures it.

    rho = pi_old / mu      the trainer's pre-update probability of the token over the engine's (recorded)

`off_policy_weights` turns rho into the weight of the token's policy-gradient term (trainer/grpo.py's
`policy_loss`): TIS caps it (Yao et al., "Your Efficient RL Framework Secretly Brings You Off-Policy RL
Training", 2025); MIS drops a token above the cap (token-level masked IS, Liu, Li et al., "When Speed
Kills Stability", 2025; veRL's token rejection `rollout_rs = "token_k1"`); IcePop drops a token outside a
band [a, b] (Ling team, "Every Step Evolves: Scaling RL for Trillion-Scale Thinking Model", Ring-1T, 2025:
M(k) = k on [alpha, beta], 0 outside; alpha = 0.5, beta = 5). `mismatch` measures the gap per step.
"""

from __future__ import annotations

import torch

from openforge.errors import TrainerError

OFF_POLICY = ("tis", "mis", "icepop", "none")


def off_policy_weights(ratio: torch.Tensor, mode: str, *, cap: float = 2.0,
                       band: tuple[float, float] = (0.5, 5.0)) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-token weight of the policy-gradient term from rho = pi_old / mu, and where it is masked.

    tis:    min(rho, cap)                 a token the engine under-sampled counts at most `cap` times
    mis:    rho, or 0 where rho > cap     the same threshold, but such a token is dropped, not capped
    icepop: rho, or 0 outside [a, b]      dropped on both sides of the band (a < 1 < b)
    none:   1                             no correction (the PPO ratio alone)

    >>> rho = torch.tensor([0.25, 1.5, 8.0])
    >>> off_policy_weights(rho, "tis")[0], off_policy_weights(rho, "mis")[0]
    (tensor([0.2500, 1.5000, 2.0000]), tensor([0.2500, 1.5000, 0.0000]))
    >>> off_policy_weights(rho, "icepop")
    (tensor([0.0000, 1.5000, 0.0000]), tensor([ True, False,  True]))
    """
    if mode == "tis":
        return torch.clamp(ratio, max=cap), torch.zeros_like(ratio, dtype=torch.bool)
    if mode == "mis":
        dropped = ratio > cap
    elif mode == "icepop":
        dropped = (ratio < band[0]) | (ratio > band[1])
    elif mode == "none":
        return torch.ones_like(ratio), torch.zeros_like(ratio, dtype=torch.bool)
    else:
        raise TrainerError(f"unknown off_policy {mode!r} ({', '.join(OFF_POLICY)})")
    return torch.where(dropped, torch.zeros_like(ratio), ratio), dropped


def mismatch(logp_trainer: torch.Tensor, logp_engine: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The engine/trainer gap on the mask tokens, as sums and maxima (the step divides by its tokens).

    With log rho = log pi_old - log mu: |log rho| (sum, max), k3 = rho - 1 - log rho (sum; its mean over
    tokens sampled from mu is an unbiased, never negative estimate of KL(mu || pi_old), veRL's `k3_kl`)
    and the largest rho (0 without tokens).

    >>> m = mismatch(torch.log(torch.tensor([[0.5, 0.2]])), torch.log(torch.tensor([[0.25, 0.2]])), torch.ones(1, 2))
    >>> round(m["k3_sum"], 4), round(m["ratio_max"], 4)        # rho = 2: 2 - 1 - log 2; rho = 1: 0
    (0.3069, 2.0)
    """
    m = mask.double()
    # float64 and expm1: k3 ~ (log rho)^2 / 2 is ~1e-14 for an fp32 engine and trainer that agree, far
    # below fp32's rounding of rho - 1 (which could even make it negative)
    log_rho = (logp_trainer.double() - logp_engine.double()) * m
    rho = torch.exp(log_rho)
    k3 = (torch.expm1(log_rho) - log_rho) * m
    gap = log_rho.abs()
    return {"gap_sum": float(gap.sum()), "gap_max": float(gap.max()) if gap.numel() else 0.0,
            "k3_sum": float(k3.sum()), "ratio_max": float((rho * m).max()) if rho.numel() else 0.0}
