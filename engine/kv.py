"""A batch's KV cache for continuous batching: rows join and leave between decode steps.

The cache is a transformers `DynamicCache` whose per-layer tensors are [B, heads, T, head_dim]. Rows
have different lengths, so each row is *left*-padded to T (`pads[i]` empty slots, then its real
entries). The attention mask hides the pads and `position_ids` carry each row's true position, so a
padded row computes the same attention as it would alone (masked keys get exactly zero weight).

    join(cache, pads)  pad whichever side is shorter on the left, concatenate on the batch axis
    keep(rows)      select rows; then drop leading columns that are padding in every row
"""

from __future__ import annotations

from typing import Any

import torch


def _layers(cache: Any) -> list[Any]:
    return list(cache.layers)


def _left_pad(t: torch.Tensor, n: int) -> torch.Tensor:
    if n == 0:
        return t
    pad = torch.zeros(*t.shape[:-2], n, t.shape[-1], dtype=t.dtype, device=t.device)
    return torch.cat([pad, t], dim=-2)


class BatchKV:
    """The KV cache of the running rows of one batch, with each row's left padding."""

    def __init__(self) -> None:
        self.cache: Any = None  # DynamicCache, None while the batch is empty
        self.pads: list[int] = []

    @property
    def size(self) -> int:
        return len(self.pads)

    @property
    def length(self) -> int:
        """T: the padded length of every row."""
        return self.cache.get_seq_length() if self.cache is not None else 0

    def join(self, cache: Any, pads: list[int] | None = None) -> None:
        """Append the rows of a freshly prefilled cache (left-padded by `pads`, default none)."""
        new_len = cache.get_seq_length()
        pads = list(pads) if pads is not None else [0] * _layers(cache)[0].keys.shape[0]
        if self.cache is None:
            self.cache, self.pads = cache, pads
            return
        old_len = self.length
        total = max(old_len, new_len)
        for mine, theirs in zip(_layers(self.cache), _layers(cache)):
            mine.keys = torch.cat([_left_pad(mine.keys, total - old_len), _left_pad(theirs.keys, total - new_len)], 0)
            mine.values = torch.cat([_left_pad(mine.values, total - old_len),
                                     _left_pad(theirs.values, total - new_len)], 0)
        self.pads = [p + total - old_len for p in self.pads] + [p + total - new_len for p in pads]

    def keep(self, rows: list[int]) -> None:
        """Keep only `rows` (in this order), then trim padding common to all of them."""
        if not rows:
            self.cache, self.pads = None, []
            return
        if rows == list(range(self.size)):
            return
        index = torch.tensor(rows, device=_layers(self.cache)[0].keys.device)
        trim = min(self.pads[r] for r in rows)
        for layer in _layers(self.cache):
            layer.keys = layer.keys.index_select(0, index)[..., trim:, :]
            layer.values = layer.values.index_select(0, index)[..., trim:, :]
        self.pads = [self.pads[r] - trim for r in rows]

    def decode_mask(self, device: Any) -> torch.Tensor:
        """The [B, T + 1] attention mask of a decode step (pads 0, cached and new token 1)."""
        t = self.length
        cols = torch.arange(t + 1, device=device).unsqueeze(0)
        return (cols >= torch.tensor(self.pads, device=device).unsqueeze(1)).long()
