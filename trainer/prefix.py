"""Shared-prefix training: a prompt prefix common to several rows (a GRPO group's prompt; a harness's
system prompt and tools, the same across groups) goes through the model once per pass, and the
gradient it gets is the exact sum of what every row sends it.

    prefix forward, with its graph   K_l, V_l = f_l(prefix) for every layer l          [1, H, P, d]
    cut the graph                    K'_l, V'_l = detached leaves that require grad
    each micro-batch of suffixes     logits = f(suffix | K', V' expanded to [B, H, P, d]); loss.backward()
                                       -> the weights' gradient through the suffix positions, and
                                          dL/dK'_l, dL/dV'_l summed over every row (autograd accumulates)
    prefix backward, once            torch.autograd.backward([K_l, V_l], [dL/dK'_l, dL/dV'_l])

This is the chain rule, not an approximation: the prefix carries no loss token (it ends before the
position that predicts any row's first sampled token), so the loss depends on the prefix only
through its keys and values, and dL/dtheta = sum_rows (direct suffix terms) + (dKV/dtheta)^T sum_rows
dL/dKV. Only the float summation order differs from running every row in full (tests/trainer/test_trainer.py
compares the two gradients; bench/prefix.py measures time and memory).

Cost: the prefix's activations are kept until the last suffix micro-batch of its unit has run (one
copy instead of one per row), and each micro-batch attends over P + S keys, as the full rows would.

Two levels: a harness's system prompt and tools are shared by every group of a step, and each
group's prompt goes on past them (Claude Code: 44.4k tokens common to all tasks, then ~3.9k of the
task and an agent list per task). Inside a unit, rows sharing a further `prefix2` run it once on top
of the unit's prefix, by the same chain rule, so each row's own part is only its answer.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Callable

import torch

PastFactory = Callable[[int], Any]  # batch size -> a fresh HF cache holding the prefix's K/V


def shared_prefixes(samples: Sequence[Any], min_len: int) -> list[tuple[int, list[int]]]:
    """Rows -> units (prefix length P, row indices): the rows of a unit share their first P tokens.

    Rows are sorted by their token ids, so rows with a long common prefix are neighbours and the
    common prefix of a run of them is the minimum over neighbours. The sorted rows are cut into runs
    that save the most prefix tokens, sum (rows - 1) * P, over runs with P >= `min_len` (a dynamic
    program over cut points). A prefix ends before the position that predicts any of its rows' first
    sampled token, so it has no loss. Rows that share with nobody come last, as (0, rows).

    >>> from types import SimpleNamespace as S
    >>> rows = [S(token_ids=[1, 2, 3, 4, 5, 9], loss_mask=[0, 0, 0, 0, 0, 1]),
    ...         S(token_ids=[1, 2, 3, 4, 6, 9], loss_mask=[0, 0, 0, 0, 0, 1]), S(token_ids=[7, 8], loss_mask=[0, 1])]
    >>> shared_prefixes(rows, 3)
    [(4, [0, 1]), (0, [2])]
    """
    if not samples:
        return []
    order = sorted(range(len(samples)), key=lambda i: samples[i].token_ids)
    cap = [samples[i].loss_mask.index(1) - 1 for i in order]
    near = [0] + [_common_length(samples[order[k - 1]].token_ids, samples[order[k]].token_ids)
                  for k in range(1, len(order))]  # near[k]: common length of sorted rows k-1 and k
    # best[j]: the most tokens saved by cutting sorted rows [0, j) into runs; start[j]: where its last run starts
    best, start = [0] * (len(order) + 1), list(range(-1, len(order)))
    for j in range(1, len(order) + 1):
        best[j], start[j], P = best[j - 1], j - 1, cap[j - 1]
        for i in range(j - 2, -1, -1):  # the run [i, j)
            P = min(P, near[i + 1], cap[i])
            if P < min_len:
                break  # P only shrinks as the run grows
            if best[i] + (j - i - 1) * P > best[j]:
                best[j], start[j] = best[i] + (j - i - 1) * P, i
    units: list[tuple[int, list[int]]] = []
    alone: list[int] = []
    j = len(order)
    while j > 0:
        i = start[j]
        if j - i > 1:
            units.append((min(cap[i:j] + near[i + 1:j]), order[i:j]))
        else:
            alone.append(order[i])
        j = i
    return units[::-1] + ([(0, sorted(alone))] if alone else [])


def _common_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    diff = (torch.tensor(a[:n]) != torch.tensor(b[:n])).nonzero()
    return int(diff[0]) if len(diff) else n


def units_of(micro_batches: Sequence[dict[str, torch.Tensor]], key: str = "prefix") -> list[list[int]]:
    """Indices of micro-batches grouped into units: consecutive ones with the same `prefix_id` (or
    `prefix2_id` with key="prefix2"), or one micro-batch without one."""
    units: list[list[int]] = []
    last = None
    for i, mb in enumerate(micro_batches):
        pid = int(mb[f"{key}_id"]) if f"{key}_id" in mb else None
        if pid is not None and pid == last:
            units[-1].append(i)
        else:
            units.append([i])
        last = pid
    return units


@contextmanager
def shared_prefix(model: Any, mb: dict[str, torch.Tensor], *, grad: bool, autocast_dtype: torch.dtype | None = None,
                  parent: PastFactory | None = None, key: str = "prefix") -> Iterator[PastFactory | None]:
    """Run `mb`'s prefix (if it has one) and yield a factory of caches holding its K/V; on a clean
    exit with `grad`, send the gradient the suffixes accumulated on those K/V through the prefix.

    Nested (key="prefix2", `parent` = the enclosing prefix's factory): the second-level prefix runs on
    top of the first's K/V leaves, so its backward also sends their share of the gradient into those
    leaves before the first level's own backward runs (the inner context exits first)."""
    if parent is None and key != "prefix":
        yield parent
        return
    if f"{key}_ids" not in mb:
        yield parent
        return
    ids = mb[f"{key}_ids"][None]
    cache = parent(1) if parent is not None else None
    mask = torch.ones(1, ids.shape[1] + (cache.get_seq_length() if cache is not None else 0),
                      dtype=torch.long, device=ids.device)
    with torch.set_grad_enabled(grad), autocast(ids.device.type, autocast_dtype):
        # logits_to_keep=1: the prefix's logits are never used (0 would mean all of them in HF)
        out = model(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True, logits_to_keep=1)
    kv = [t for layer in out.cache.layers for t in (layer.keys, layer.values)]
    leaves = [t.detach().requires_grad_(grad) for t in kv]

    def past(batch: int) -> Any:
        from transformers import DynamicCache

        pairs = [(leaves[j].expand(batch, -1, -1, -1), leaves[j + 1].expand(batch, -1, -1, -1))
                 for j in range(0, len(leaves), 2)]
        return DynamicCache(ddp_cache_data=pairs)

    yield past
    if grad:
        pairs = [(t, leaf.grad) for t, leaf in zip(kv, leaves) if leaf.grad is not None]
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])


def autocast(device_type: str, dtype: torch.dtype | None) -> Any:
    """Autocast to `dtype`, or a no-op context for fp32 (None)."""
    if dtype is None:
        return torch.autocast(device_type=device_type, enabled=False)
    return torch.autocast(device_type=device_type, dtype=dtype)
