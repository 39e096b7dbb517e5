"""Assemble a rollout's recorded calls into training sequences.

A segment is one token sequence: the first call's prompt (mask 0), its completion (mask 1), then for
every later call whose prompt starts with the segment so far, the new prompt tokens (tool results,
the next user turn: mask 0) and its completion (mask 1). A call whose prompt extends no open segment
starts a new one: the harness rewrote its history (context compaction) or runs a second conversation
(a sub-agent). A call with exactly the prompt of a segment's last call is a retry: it replaces that
call (the harness kept the retry's answer, not the first one's).

    seg tokens : [p0 p0 p0 | c0 c0 | t t | c1 c1 c1]
    loss mask  : [ 0  0  0 |  1  1 | 0 0 |  1  1  1]
    logprobs   : [ 0  0  0 | l  l  | 0 0 |  l  l  l]   sampling logprobs, 0.0 where the mask is 0

With images (a GUI agent's screenshots), equal token ids are not enough: two screenshots expand to
the same placeholder tokens. A call extends a segment only if the images of the shared prefix are the
same images (sha256, `call.images`); a segment's `images` are the ids of the images in its tokens, in
the order of their placeholder runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from openforge.rollouts.harnesses.base import SideCalls
from openforge.store import Call, Store, Trajectory


@dataclass
class _Segment:
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    call_ids: list[int] = field(default_factory=list)
    last_prompt_len: int = 0  # where the last call's prompt ended (a retry truncates back to it)
    images: list[str] = field(default_factory=list)  # sha256 ids of the images in `tokens`, in order

    def extended_by(self, prompt: list[int], images: list[str]) -> bool:
        return _starts_with(prompt, self.tokens) and images[:len(self.images)] == self.images

    def extend(self, call_id: int, prompt: list[int], completion: list[int], lps: list[float],
               images: list[str] | None = None) -> None:
        self.images = list(images or [])  # a prompt's images include those of the prefix it extends
        new = prompt[len(self.tokens):]
        self.tokens += new
        self.mask += [0] * len(new)
        self.logprobs += [0.0] * len(new)
        self.last_prompt_len = len(self.tokens)
        self.tokens += completion
        self.mask += [1] * len(completion)
        self.logprobs += [0.0 if x is None or math.isnan(x) else float(x) for x in lps]  # None: engine sent none
        self.call_ids.append(call_id)

    def retry(self, call_id: int, prompt: list[int], completion: list[int], lps: list[float],
              images: list[str] | None = None) -> None:
        del self.tokens[self.last_prompt_len:], self.mask[self.last_prompt_len:], self.logprobs[self.last_prompt_len:]
        self.call_ids.pop()
        self.extend(call_id, prompt, completion, lps, images)

    def prompt_of_last(self) -> list[int]:
        return self.tokens[:self.last_prompt_len]


def _starts_with(seq: list[int], prefix: list[int]) -> bool:
    return len(seq) >= len(prefix) and seq[:len(prefix)] == prefix


def assemble_calls(calls: list[Call]) -> tuple[list[_Segment], dict[str, int]]:
    """The pure part: finished calls (in order) -> segments and counts."""
    segments: list[_Segment] = []
    stats = {"n_calls": 0, "n_extends": 0, "n_segments": 0, "n_retries": 0, "n_tokens": 0, "n_sampled": 0}
    for call in calls:
        prompt, completion = call.prompt_ids or [], call.completion_ids or []
        lps = call.logprobs or []
        lps = (lps + [float("nan")] * len(completion))[:len(completion)]
        images = list(call.images or [])
        stats["n_calls"] += 1
        retried = next((s for s in reversed(segments) if s.prompt_of_last() == prompt and s.images == images), None)
        if retried is not None:
            retried.retry(call.id or 0, prompt, completion, lps, images)
            stats["n_retries"] += 1
            continue
        # The longest open segment this prompt extends (sub-agents interleave with the main agent).
        best = max((s for s in segments if s.extended_by(prompt, images)), key=lambda s: len(s.tokens), default=None)
        if best is not None:
            best.extend(call.id or 0, prompt, completion, lps, images)
            stats["n_extends"] += 1
        else:
            seg = _Segment()
            seg.extend(call.id or 0, prompt, completion, lps, images)
            segments.append(seg)
    stats["n_segments"] = len(segments)
    stats["n_tokens"] = sum(len(s.tokens) for s in segments)
    stats["n_sampled"] = sum(sum(s.mask) for s in segments)
    return segments, stats


def assemble_rollout(store: Store, rollout_id: str, side_calls: SideCalls = SideCalls()) -> dict[str, Any]:
    """Write the rollout's Trajectory rows (replacing earlier ones) and its counts; return the counts.

    Only calls with status `ok` are used: a failed or interrupted call sampled nothing the harness saw.
    The harness's own background calls (`side_calls`: a title, a summary) are tagged on their rows
    (`call.side`) first, and left out unless the harness's spec trains on them."""
    rollout = store.get_rollout(rollout_id)
    calls = store.list_calls(rollout_id=rollout_id)  # every call is tagged (a failed summary too); ok ones train
    side = {c.id: name for c in calls if c.id is not None and (name := side_calls.name_of(c.request_json))}
    store.tag_side_calls(side)
    calls = [c for c in calls if c.status == "ok" and (side_calls.train or c.id not in side)]
    calls.sort(key=lambda c: (c.seq, c.id or 0))
    segments, stats = assemble_calls(calls)
    rows = [
        Trajectory(run_id=rollout.run_id, rollout_id=rollout_id, segment=i, token_ids=s.tokens,
                   loss_mask=s.mask, logprobs=s.logprobs, call_ids=s.call_ids, images=s.images or None,
                   n_tokens=len(s.tokens))
        for i, s in enumerate(segments)
    ]
    store.replace_trajectories(rollout_id, rows)
    store.update_rollout(rollout_id, n_segments=stats["n_segments"], n_extends=stats["n_extends"],
                         n_calls=stats["n_calls"], n_tokens=stats["n_tokens"])
    return stats
