"""Next-token sampling with SGLang's semantics, and the logprob it reports for the sampled token.

Logprob definition (what `meta_info.output_token_logprobs` holds), the same as SGLang's sampler:

    greedy (temperature < 1e-6 or top_k == 1):  logprob = log_softmax(logits)[token]
    otherwise:                                  logprob = log_softmax(logits / temperature)[token]

i.e. the log-probability under the temperature-scaled distribution, *before* top-k / top-p / min-p
truncation. At temperature 1 (what an RL run samples at) this is the raw model logprob the trainer
recomputes. Setting SGLANG_RETURN_ORIGINAL_LOGPROB=1 makes both engines report log_softmax(logits)
at any temperature (SGLang reads the same variable).

Truncation follows SGLang's torch sampler: sort, drop tokens whose preceding cumulative mass already
exceeds top_p, keep the top_k, drop tokens below min_p x the top probability, then sample from what
is left (torch.multinomial renormalises). Each sequence draws from its own seeded torch.Generator, so a
seeded request gives the same tokens whatever else shares its batch.
"""

from __future__ import annotations

import os

import torch

from openforge.engine.protocol import SamplingParams


def return_original_logprob() -> bool:
    return os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB", "").lower() in ("1", "true", "yes")


def _truncate(probs: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """probs [V] -> the same probabilities with the truncated tokens zeroed, in vocabulary order.

    Sampling happens in vocabulary order, not sorted order: two near-equal probabilities can swap
    places in a sort under 1e-7 of numerical noise (batched vs. alone), which would change the token
    a seeded draw lands on. In vocabulary order such noise moves a boundary by 1e-7 only."""
    if p.top_p >= 1.0 and p.top_k <= 0 and p.min_p <= 0:
        return probs
    sorted_p, idx = probs.sort(descending=True)
    drop = torch.zeros_like(sorted_p, dtype=torch.bool)
    if p.top_p < 1.0:
        drop |= sorted_p.cumsum(0) - sorted_p > p.top_p
    if p.top_k > 0:
        drop[p.top_k:] = True
    if p.min_p > 0:
        drop |= sorted_p < sorted_p[0] * p.min_p
    return probs.masked_fill(torch.zeros_like(drop).scatter(0, idx, drop), 0.0)


def sample_next(logits: torch.Tensor, params: list[SamplingParams],
                generators: list[torch.Generator]) -> tuple[list[int], list[float]]:
    """logits [B, V] (any float dtype) -> (token id per row, its logprob per row, as defined above)."""
    logits = logits.float()
    raw_logprobs = torch.log_softmax(logits, dim=-1)
    tokens: list[int] = []
    logprobs: list[float] = []
    original = return_original_logprob()
    for row, (p, gen) in enumerate(zip(params, generators)):
        if p.greedy:
            token = int(torch.argmax(logits[row]))
            lp = raw_logprobs[row, token]
        else:
            scaled = torch.log_softmax(logits[row] / p.temperature, dim=-1)
            token = int(torch.multinomial(_truncate(scaled.exp(), p), 1, generator=gen))
            lp = raw_logprobs[row, token] if original else scaled[token]
        tokens.append(token)
        logprobs.append(float(lp))
    return tokens, logprobs
