"""Which harness each GRPO group runs in, when a run trains in several (`harness.names`).

A group is sampled in one harness: its advantages compare samples of one program's prompts and tools.
Groups are dealt out by smooth weighted round-robin over the run's groups, counted from the first
step, so the mix is deterministic (a resumed or repeated run deals the same) and follows the weights
at every prefix: with {"a": 3, "b": 1} the groups go a, a, b, a, a, a, b, a, ...; equal weights (a
list) take the harnesses in turn. The task stream is shuffled, so which task meets which harness varies.
"""

from __future__ import annotations

from collections.abc import Mapping


def group_harnesses(weights: Mapping[str, float], first: int, n: int) -> list[str]:
    """The harnesses of groups `first` .. `first + n - 1` of a run, by smooth weighted round-robin.

    >>> group_harnesses({"a": 3, "b": 1}, 0, 8)
    ['a', 'a', 'b', 'a', 'a', 'a', 'b', 'a']
    >>> group_harnesses({"a": 1, "b": 1}, 3, 2)
    ['b', 'a']
    """
    names, total = list(weights), sum(weights.values())
    current = dict.fromkeys(names, 0.0)
    out: list[str] = []
    for _ in range(first + n):  # replayed from the run's first group: cheap, and a pure function of it
        for name in names:
            current[name] += weights[name]
        pick = max(names, key=lambda name: current[name])  # ties: the first listed
        current[pick] -= total
        out.append(pick)
    return out[first:]

