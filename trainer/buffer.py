"""Asynchronous sampling with bounded staleness: groups sampled continuously, trained as they finish.

With `trainer.max_staleness = K > 0` the loop does not sample a step and then train on it. A
`GroupBuffer` keeps groups (one task x `group_size` rollouts, one `Sampler.sample` call each, in a
thread of its own) running against whatever adapter the engine serves when the group starts, and
the trainer takes a batch as soon as one is complete; each new adapter is hot-loaded while groups
of older versions go on.

Versions. The adapter after step s-1 is version s (the base or `init_from` adapter is version 0); a
group records the version it started under (every rollout of it carries that adapter:
`Rollout.adapter`, and so every call: `Call.adapter`), so all of its tokens come from one behaviour
policy and their recorded logprobs are that policy's (the loss's TIS weight is taken against them).
A group of version v trained at step s has staleness s - v.

Admission is paced, never discard-and-requeue (dropping stale groups starves the slow tasks): under
version v the buffer holds at most (v + K + 1) x `groups_per_step` groups admitted in all, so at most
(K + 1) steps' worth are ahead of the trainer. The declared policy for a group about to exceed K:
the trainer *waits* for it and trains it in the next batch (which may then hold more than
`groups_per_step` groups); no group is dropped for its age, so a task whose rollouts take 10x longer
is trained at its sampling rate. Counted per step: `stale_waits` (steps that waited on such a group),
the staleness histogram, buffer depth, versions in flight.

A group whose every rollout failed for infrastructure reasons (`StepFailed`) is dropped and counted
(`failed_groups`), as a failed group in a synchronous step is; a batch of nothing but such groups
ends the run as a failed step does. Any other sampling error ends it from the trainer's thread.

K = 0 admits one step's groups under the current version and waits for all of them: the synchronous
loop's batches, group for group (tests/trainer/test_async.py).

Partial rollouts (`trainer.rollout_versions` N > 1). On each `publish` the run's rollouts still
running move onto the new adapter (`Store.move_live_rollouts`): their next calls are served by it and
record it, so a long rollout samples its later turns from a newer policy instead of finishing under
one K versions old. A group still counts by the version it started under (its oldest tokens), so the
staleness bound holds for every token. The cap on versions per rollout has a declared policy
(`trainer.rollout_versions_policy`): `finish_old` leaves a rollout that has spanned N versions on the
last of them (counted per step: `version_capped`, rollouts held back at a publish); `drop_group`
moves it on anyway and the trainer drops its group (`version_dropped_groups`, trainer/data.py).
Counted per step as well: `rollouts_moved`, and from the trained tokens themselves `token_staleness`
(sampled tokens by versions behind) and `spanning_rollouts` (trainer/data.py `version_metrics`).

Resume. A checkpoint records the positions admitted and not yet taken (`pending`); a resumed buffer
admits them again first, then goes on from the checkpoint's position. A group that had finished
before the stop, within the staleness bound, is not sampled again: it is admitted finished, with its
own version and rows (`KeptGroups`, trainer/resume.py).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

from openforge.rollouts.runner.failures import StepFailed
from openforge.store import Rollout, Store
from openforge.trainer.resume import KeptGroups
from openforge.trainer.samplers import Sampler


@dataclass
class Group:
    """One task's group: where it sits in the task stream, and the version that sampled it."""

    position: int  # index in the task stream (TaskStream.take)
    task: Any
    version: int
    adapter: str | None
    t_start: float
    rollouts: list[Rollout] | None = None  # None while in flight
    t_done: float | None = None
    failed: StepFailed | None = None  # every rollout of the group failed for infrastructure reasons


@dataclass(frozen=True)
class PartialRollouts:
    """Move running rollouts onto each published adapter, up to `max_versions` per rollout (module doc)."""

    store: Store
    max_versions: int
    drop_group: bool  # the policy at the cap: False = finish under the old version, True = drop the group


@dataclass
class Taken:
    """What `GroupBuffer.take` hands the trainer for one step."""

    rollouts: list[Rollout]
    tasks: list[Any]
    waited_s: float  # time the trainer waited for this batch
    stats: dict[str, Any] = field(default_factory=dict)  # staleness histogram, buffer depth, versions in flight


class GroupBuffer:
    """Groups of `sampler` over `stream` from `position` on, paced by `max_staleness` (module doc).

    The trainer calls `take(step)` (blocks until a batch is ready), then `publish(version, adapter)`
    once the next adapter is served, and `close()` at the end. An error in a group's sampling
    (a `Cancelled`, an engine gone) is raised from the next `take`."""

    def __init__(self, sampler: Sampler, run_id: str, stream: Any, *, groups_per_step: int, max_staleness: int,
                 position: int, version: int, adapter: str | None, end: int,
                 partial: PartialRollouts | None = None, pending: Sequence[int] = (),
                 kept: KeptGroups | None = None) -> None:
        self.sampler, self.run_id, self.stream = sampler, run_id, stream
        self.end = end  # no group starts at or after this stream position (the run's last step's end)
        self.B, self.K = groups_per_step, max_staleness
        self.position, self.version, self.adapter = position, version, adapter
        self.groups: list[Group] = []  # admitted and not yet taken, in admission order
        self.error: BaseException | None = None
        self.partial = partial
        self.moved = self.capped = 0  # partial rollouts since the last take: moved on, held at the cap
        self.kept = kept or KeptGroups()
        self.closed = False
        self.cond = threading.Condition()
        with self.cond:
            for pos in pending:  # a resume: admitted before the stop, not trained
                self._start(pos)
            self._admit()

    def _admit(self) -> None:
        """Start every group the pace allows under the current version (the lock is held)."""
        while not self.closed and self.position < min((self.version + self.K + 1) * self.B, self.end):
            self.position += 1
            self._start(self.position - 1)

    def _start(self, pos: int) -> None:
        """Sample the group at stream position `pos`, or take the one a resume kept finished (trainer/resume.py)."""
        task, now = self.stream.take(pos, 1)[0], time.perf_counter()
        kept = self.kept.take(pos)
        if kept is not None:
            self.groups.append(Group(pos, task, kept.version, kept.adapter, now, list(kept.rollouts), now))
            self.cond.notify_all()
            return
        g = Group(pos, task, self.version, self.adapter, now)
        self.groups.append(g)
        threading.Thread(target=self._sample, args=(g,), name=f"forge-group-{pos}", daemon=True).start()

    def _sample(self, g: Group) -> None:
        try:
            # step = the position's nominal step: with K = 0 exactly the synchronous loop's label
            rollouts = self.sampler.sample(self.run_id, [g.task], step=g.position // self.B, adapter=g.adapter)
        except StepFailed as exc:  # one group's rollouts all failed: dropped like a failed group in a step
            with self.cond:
                g.rollouts, g.t_done, g.failed = [], time.perf_counter(), exc
                self.cond.notify_all()
            return
        except BaseException as exc:  # raised in the trainer's thread by take()
            with self.cond:
                self.error = self.error or exc
                self.cond.notify_all()
            return
        with self.cond:
            g.rollouts, g.t_done = list(rollouts), time.perf_counter()
            self.cond.notify_all()

    def _ready(self, step: int) -> list[Group] | None:
        """The batch for `step` if one is ready: every group that would exceed K after this step
        (version <= step - K) must be done; then the oldest done groups up to `groups_per_step`."""
        if not self.groups and self.position >= self.end:
            return []  # nothing left to sample (earlier batches took more than their share)
        due = [g for g in self.groups if g.version <= step - self.K]
        if any(g.rollouts is None for g in due):
            return None
        done = sorted((g for g in self.groups if g.rollouts is not None), key=lambda g: (g.version, g.position))
        last = self.position >= self.end and len(done) == len(self.groups)  # the run's last groups
        if not done or (len(done) < self.B and not last):
            return None
        return due + [g for g in done if g not in due][: max(self.B - len(due), 0)]

    def take(self, step: int) -> Taken:
        t0 = time.perf_counter()
        waited_on_due = False
        with self.cond:
            while True:
                if self.error is not None:
                    raise self.error
                batch = self._ready(step)
                if batch is not None:
                    break
                waited_on_due = waited_on_due or any(g.rollouts is None and g.version <= step - self.K
                                                     for g in self.groups)
                self.cond.wait()
            for g in batch:
                self.groups.remove(g)
            failed = [g.failed for g in batch if g.failed is not None]
            if batch and len(failed) == len(batch):  # a whole batch with nothing to learn: as a failed step
                raise failed[0]
            batch.sort(key=lambda g: g.position)  # the order the synchronous loop builds a step in
            in_flight = Counter(g.version for g in self.groups if g.rollouts is None)
            stats = {
                "staleness": dict(sorted(Counter(step - g.version for g in batch).items())),
                "buffer_depth": sum(1 for g in self.groups if g.rollouts is not None),  # done, waiting to train
                "versions_in_flight": dict(sorted(in_flight.items())),
                "stale_waits": int(waited_on_due and self.K > 0),
                "failed_groups": len(failed),  # every rollout an infrastructure failure: dropped
            }
            if self.partial is not None:
                stats |= {"rollouts_moved": self.moved, "version_capped": self.capped}
                self.moved = self.capped = 0
        rollouts = [r for g in batch for r in g.rollouts or []]
        return Taken(rollouts, [g.task for g in batch], time.perf_counter() - t0, stats)

    def pending(self) -> list[int]:
        """The positions admitted and not yet taken: what a checkpoint records for a resume to admit again."""
        with self.cond:
            return sorted(g.position for g in self.groups)

    def publish(self, version: int, adapter: str | None) -> None:
        """The engine serves `adapter` (version `version`) now: new groups start with it (and, with
        partial rollouts, the running ones go on with it)."""
        if self.partial is not None:
            moved, capped = self.partial.store.move_live_rollouts(
                self.run_id, adapter, max_adapters=self.partial.max_versions, past_cap=self.partial.drop_group)
            with self.cond:
                self.moved, self.capped = self.moved + moved, self.capped + capped
        with self.cond:
            self.version, self.adapter = version, adapter
            self._admit()

    def close(self) -> None:
        """Admit nothing more. Groups in flight are abandoned (their threads end with the sampler's
        cancel token or the run); their rollouts end up interrupted, and a resume samples those groups again."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()


def staleness_of(batch_stats: Sequence[dict[str, Any]]) -> Counter:
    """The staleness histogram over several steps' `Taken.stats` (bench, dashboard)."""
    total: Counter = Counter()
    for s in batch_stats:
        total.update({int(k): int(v) for k, v in s.get("staleness", {}).items()})
    return total
