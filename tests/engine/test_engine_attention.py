"""engine/attention.py: the split attention (past keys without a mask, the chunk's own causally, recombined by
log-sum-exp) gives what one masked attention over all keys gives, and leaves the cases it does not cover alone."""

from __future__ import annotations

import torch

from openforge.engine.attention import split_sdpa_attention


class _Heads(torch.nn.Module):
    num_key_value_groups = 2  # grouped-query attention: 2 query heads share each key/value head
    is_causal = True


def _masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past: int) -> torch.Tensor:
    k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    n = q.shape[2]
    mask = torch.ones(n, past + n, dtype=torch.bool)
    mask[:, past:] = torch.tril(torch.ones(n, n, dtype=torch.bool))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)


def test_a_chunk_after_a_past_matches_one_masked_attention() -> None:
    torch.manual_seed(0)
    past, n = 7, 5
    q = torch.randn(1, 4, n, 16)
    k, v = torch.randn(1, 2, past + n, 16), torch.randn(1, 2, past + n, 16)
    out, weights = split_sdpa_attention(_Heads(), q, k, v, attention_mask=None)
    assert weights is None and out.shape == (1, n, 4, 16)
    torch.testing.assert_close(out, _masked(q, k, v, past), atol=1e-5, rtol=1e-5)
    # without the causal half (the chunk's later keys visible to every query) the numbers differ: the check can fail
    assert not torch.allclose(out, _unmasked(q, k, v), atol=1e-3)


def _unmasked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2)


def test_a_single_decode_token_goes_to_the_stock_path_unchanged() -> None:
    torch.manual_seed(1)
    q = torch.randn(1, 4, 1, 16)
    k, v = torch.randn(1, 2, 6, 16), torch.randn(1, 2, 6, 16)
    out, _ = split_sdpa_attention(_Heads(), q, k, v, attention_mask=None, is_causal=False)
    torch.testing.assert_close(out, _unmasked(q, k, v), atol=1e-5, rtol=1e-5)
