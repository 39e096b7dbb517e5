"""The prefix cache: KV of token prefixes in a radix tree, as SGLang's RadixAttention keeps them.

A harness sends the same system prompt and tools at the start of every rollout and every turn, and
each turn's prompt starts with the previous turn's prompt and answer. The tree is keyed by token
ids; an edge holds the KV (post-RoPE keys and values, per layer) of its tokens, so every request
whose ids start with a path shares that path's KV and only the rest is computed:

    cache = PrefixCache(budget_bytes=512 * 2**20)
    n, kv = cache.match(key, ids)    # the longest cached prefix: n tokens, per-layer (K, V) [1, h, n, d]
    cache.insert(key, ids, kv)       # kv covers ids; only what the tree lacks is copied in
    cache.drop_adapter(name)         # that adapter's entries; clear() for new base weights

`key` is the adapter a forward pass used ((name, path), or None for the base model): KV computed
under one adapter is never served to another. The budget counts the bytes of every stored
tensor; above it the least recently used leaf goes first (a parent becomes a leaf in its turn),
like SGLang's LRU eviction. Positions are absolute (token i of a prompt is at position i in every
request), so a cached key is exactly the key a fresh forward pass computes, up to float rounding.
Only the scheduler thread uses it, so no lock.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (keys, values), each [1, kv_heads, tokens, head_dim]


class _Node:
    __slots__ = ("ids", "kv", "children", "parent", "last_used")

    def __init__(self, ids: tuple[int, ...], kv: KV, parent: _Node | None) -> None:
        self.ids = ids  # the edge's token ids
        self.kv = kv  # the KV of exactly those tokens
        self.children: dict[int, _Node] = {}  # by first token id
        self.parent = parent
        self.last_used = 0

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.kv)


def _common(edge: tuple[int, ...], ids: Sequence[int], start: int) -> int:
    n = 0
    for a, b in zip(edge, ids[start:start + len(edge)]):
        if a != b:
            break
        n += 1
    return n


def _slice(kv: KV, start: int, stop: int | None = None, *, copy: bool = False) -> KV:
    out = [(k[..., start:stop, :], v[..., start:stop, :]) for k, v in kv]
    # A copy owns just its slice: a view would pin the whole source tensor (a batch's KV) in memory.
    return [(k.clone(), v.clone()) for k, v in out] if copy else out


class PrefixCache:
    """Radix trees of prompt-prefix KV, one per adapter key, under one memory budget with LRU eviction."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.bytes = 0
        self.evictions = 0
        self._roots: dict[Hashable, _Node] = {}
        self._clock = itertools.count(1)

    @property
    def nodes(self) -> int:
        return sum(1 for root in self._roots.values() for _ in self._walk(root)) - len(self._roots)

    def match(self, key: Hashable, ids: Sequence[int]) -> tuple[int, KV | None]:
        """The longest cached prefix of `ids` under `key`: (its length, its KV) or (0, None)."""
        node = self._roots.get(key)
        parts: list[tuple[_Node, int]] = []
        pos, tick = 0, next(self._clock)
        while node is not None and pos < len(ids):
            child = node.children.get(ids[pos])
            if child is None:
                break
            n = _common(child.ids, ids, pos)
            child.last_used = tick
            parts.append((child, n))
            pos += n
            node = child if n == len(child.ids) else None  # a partial edge ends the match
        if not parts:
            return 0, None
        layers = len(parts[0][0].kv)
        kv = [tuple(torch.cat([p.kv[i][j][..., :n, :] for p, n in parts], dim=-2) if len(parts) > 1
                    else parts[0][0].kv[i][j][..., :parts[0][1], :] for j in (0, 1)) for i in range(layers)]
        return pos, kv  # type: ignore[return-value]

    def insert(self, key: Hashable, ids: Sequence[int], kv: KV) -> int:
        """Add the KV of `ids` (kv covers exactly ids) under `key`; returns the tokens newly stored."""
        if not ids:
            return 0
        root = self._roots.setdefault(key, _Node((), [], None))
        node, pos, tick = root, 0, next(self._clock)
        while pos < len(ids):
            child = node.children.get(ids[pos])
            if child is None:
                new = len(ids) - pos
                if new * _bytes_per_token(kv) > self.budget_bytes:
                    return 0  # it could only push everything else out and then itself
                leaf = _Node(tuple(ids[pos:]), _slice(kv, pos, copy=True), node)
                leaf.last_used = tick
                node.children[ids[pos]] = leaf
                self.bytes += leaf.nbytes
                self._evict()
                return new
            n = _common(child.ids, ids, pos)
            if n < len(child.ids):
                child = self._split(child, n)
            child.last_used = tick
            node, pos = child, pos + n
        return 0

    def drop_adapter(self, name: str) -> None:
        """Forget every entry computed under the adapter called `name` (it was unloaded)."""
        for key in [k for k in self._roots if isinstance(k, tuple) and k[0] == name]:
            self.bytes -= sum(n.nbytes for n in self._walk(self._roots.pop(key)))

    def clear(self) -> None:
        """Forget everything (the base weights changed)."""
        self._roots.clear()
        self.bytes = 0

    # -- internals --------------------------------------------------------------------------

    def _split(self, child: _Node, at: int) -> _Node:
        """Cut `child`'s edge after `at` tokens; returns the new upper node."""
        parent = child.parent
        assert parent is not None
        upper = _Node(child.ids[:at], _slice(child.kv, 0, at, copy=True), parent)
        upper.last_used = child.last_used
        child.ids, child.kv, child.parent = child.ids[at:], _slice(child.kv, at, copy=True), upper
        upper.children[child.ids[0]] = child
        parent.children[upper.ids[0]] = upper
        return upper

    def _walk(self, node: _Node):
        stack = [node]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def _evict(self) -> None:
        while self.bytes > self.budget_bytes:
            leaves = [n for root in self._roots.values() for n in self._walk(root)
                      if not n.children and n.parent is not None]
            if not leaves:
                return
            victim = min(leaves, key=lambda n: n.last_used)
            del victim.parent.children[victim.ids[0]]
            self.bytes -= victim.nbytes
            self.evictions += 1


def _bytes_per_token(kv: KV) -> int:
    return sum((k.nbytes + v.nbytes) // max(k.shape[-2], 1) for k, v in kv)
