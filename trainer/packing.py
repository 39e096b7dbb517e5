"""Packed rows for SFT: several short sequences in one row, attention never crossing between them.

A trajectory segment of the demo tasks is a few hundred tokens; padding them to the longest of a batch
wastes most of the compute. Packing lays sequences end to end in one row of at most `max_tokens`
tokens, with no padding at all (transformers' `DataCollatorWithFlattening` layout):

    tokens     a0 a1 a2 | b0 b1 | c0 c1 c2 c3
    positions   0  1  2 |  0  1 |  0  1  2  3      restart per sequence: RoPE sees each one alone
    targets    a1 a2  - | b1  - | c1 c2 c3  -      a sequence's last token predicts nothing

With `attention_mask=None` and no cache, transformers reads the restarts of `position_ids` as sequence
boundaries (masking_utils.find_packed_sequence_indices) and builds a block-diagonal causal mask for
SDPA and eager attention, and the varlen kernel's `cu_seqlens` for flash-attention on a GPU: the
packed row's log-probabilities equal each sequence's alone (tests/trainer/test_sft_packing.py checks both that
and that nothing leaks). Logits are computed only at the positions whose next token is supervised.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch


class Sequenced(Protocol):
    token_ids: list[int]
    loss_mask: list[int]


@dataclass
class PackedRow:
    """One row of packed sequences: the tensors a forward pass takes, and what it holds."""

    input_ids: torch.Tensor  # [1, T]
    position_ids: torch.Tensor  # [1, T], 0 at each sequence's first token
    targets: torch.Tensor  # [T - 1] bool: token t+1 is supervised (its loss_mask is 1, same sequence)
    n_sequences: int

    @property
    def n_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def n_targets(self) -> int:
        return int(self.targets.sum())


def pack(items: Sequence[Sequenced], max_tokens: int) -> list[list[int]]:
    """Indices of `items` grouped into rows of at most `max_tokens` tokens, first fit in the given
    order (so a shuffled epoch stays shuffled); a sequence longer than `max_tokens` is a row alone.

    >>> class S:
    ...     def __init__(self, n): self.token_ids, self.loss_mask = [0] * n, [1] * n
    >>> pack([S(3), S(6), S(2), S(9), S(4)], max_tokens=8)
    [[0, 2], [1], [3], [4]]
    """
    rows: list[list[int]] = []
    room: list[int] = []
    for i, item in enumerate(items):
        n = len(item.token_ids)
        for r, left in enumerate(room):
            if n <= left:
                rows[r].append(i)
                room[r] -= n
                break
        else:
            rows.append([i])
            room.append(max_tokens - n)
    return rows


def packed_row(items: Sequence[Sequenced]) -> PackedRow:
    """The sequences of `items` end to end, positions restarting at each."""
    ids: list[int] = []
    positions: list[int] = []
    supervised: list[bool] = []  # per token: trained on as a target
    for item in items:
        ids.extend(item.token_ids)
        positions.extend(range(len(item.token_ids)))
        # A sequence's first token is never a target: the token before it belongs to another sequence.
        supervised.extend([False] + [bool(m) for m in item.loss_mask[1:]])
    return PackedRow(input_ids=torch.tensor([ids], dtype=torch.long),
                     position_ids=torch.tensor([positions], dtype=torch.long),
                     targets=torch.tensor(supervised[1:], dtype=torch.bool), n_sequences=len(items))


def packed_nll(model: Any, row: PackedRow, device: torch.device) -> torch.Tensor:
    """The summed negative log-likelihood of `row`'s supervised tokens (fp32 log-softmax):

        sum_t mask_t * -log pi(x_t | x_<t within its own sequence)
    """
    where = row.targets.nonzero().squeeze(-1)  # positions whose next token is supervised
    if where.numel() == 0:
        return torch.zeros((), device=device)
    ids = row.input_ids.to(device)
    # attention_mask=None and use_cache=False: the two conditions under which transformers derives the
    # block-diagonal mask from the restarting positions (with a cache or a 2D mask it would not).
    logits = model(input_ids=ids, position_ids=row.position_ids.to(device), attention_mask=None, use_cache=False,
                   logits_to_keep=where.to(device)).logits[0].float()  # [K, V]
    targets = ids[0, where.to(device) + 1]
    return (torch.logsumexp(logits, dim=-1) - logits.gather(-1, targets[:, None]).squeeze(-1)).sum()
