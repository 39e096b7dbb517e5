"""A resumed run trains the rollouts that had finished for steps it had not trained, instead of sampling them again.

A stop (Ctrl-C, `forge stop`, SIGKILL) can land after a group's rollouts finished and before the step
that trains them: their rows are in the store, graded. `kept_groups` finds them, position by position
of the task stream the newest checkpoint left untrained (its `position`, and in the asynchronous loop
its `pending` positions: admitted, not yet trained), and the loop trains them as if the run had not
stopped: the synchronous loop's next step takes them in place of sampling, the asynchronous loop puts
them back into its `GroupBuffer` as finished groups.

- A position's group: the rows of its nominal step (position // tasks_per_step, `Rollout.step`) and
  task, of its newest attempt (a group sampled again after an earlier resume: the rows created since
  the newest `sample_index` 0 row, as a sampler creates a group's rows in order before any of them runs).
- Kept when every rollout of it finished (scored, failed, timed_out: a resume marks the unfinished ones
  interrupted first, and an interrupted or cancelled row means the group is sampled again), at least
  one was scored, and its version v is within `max_staleness` K of the step that resumes:
  start - K <= v <= start. Otherwise sampled again; one outside the bound is counted as stale
  (`resume_stale_groups` on the first resumed step, and a log line).
- A group's version is its oldest rollout's, and a rollout's the policy version it was created under
  (`Rollout.policy_version`, whatever the update kind: full fine-tuning's rollouts name no adapter).
  A partial rollout (`trainer.rollout_versions` > 1) moved onto newer adapters keeps that version, so
  it is judged by its oldest tokens, as the asynchronous buffer judges a group by the version it
  started under. A row without one (a store older than schema 8, or a rollout created for an older
  adapter than its run served) is dated by its adapter's name where that is its only version
  (`by_adapter`: LoRA, one version per rollout); otherwise its group is sampled again.
- Nothing is trained twice: only untrained positions are looked up, and a nominal step that deals one
  task twice (a stream epoch ending inside it) keeps neither, its rows being the same key.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

from openforge.store import Rollout, Store
from openforge.trainer.checkpoint import adapter_version

log = logging.getLogger("forge.trainer")

FINISHED = ("scored", "failed", "timed_out")  # a sampler returns these; interrupted/cancelled did not finish


@dataclass(frozen=True)
class KeptGroup:
    """A finished, untrained group: its stream position, the version that sampled it, its rows."""

    position: int
    version: int
    adapter: str | None
    rollouts: list[Rollout]


@dataclass
class KeptGroups:
    """What a resume found for the untrained positions (module doc); `take` hands each group out once."""

    groups: dict[int, KeptGroup] = field(default_factory=dict)
    stale: int = 0  # finished groups outside the staleness bound: sampled again
    found: int = 0  # groups kept, for the first resumed step's metrics

    def take(self, position: int) -> KeptGroup | None:
        return self.groups.pop(position, None)

    def metrics(self) -> dict[str, int]:
        return {"resume_kept_groups": self.found, "resume_stale_groups": self.stale}


def kept_groups(store: Store, run_id: str, stream: Any, positions: Sequence[int], *, groups_per_step: int,
                start: int, max_staleness: int, by_adapter: bool) -> KeptGroups:
    """The finished groups of `positions` (untrained stream positions) that step `start` on may train;
    `by_adapter`: a row that recorded no version is dated by its adapter's name (module doc)."""
    out = KeptGroups()
    B = groups_per_step
    for step in sorted({p // B for p in positions}):
        tasks = [str(_task_id(t)) for t in stream.take(step * B, B)]  # the whole step: a task dealt twice is ambiguous
        dealt = Counter(tasks)
        rows: dict[str, list[Rollout]] = {}
        for r in store.list_rollouts(run_id, step=step):  # oldest first
            rows.setdefault(r.task_id, []).append(r)
        for p in sorted(p for p in set(positions) if p // B == step):
            task = tasks[p - step * B]
            group = _newest_attempt(rows.get(task, []))
            if dealt[task] > 1 or not group or any(r.status not in FINISHED for r in group) \
                    or not any(r.status == "scored" for r in group):
                continue
            versions = [_version(run_id, r, by_adapter) for r in group]
            if None in versions:
                continue
            version = min(v for v in versions if v is not None)  # the oldest: the group's bound holds for every token
            if not start - max_staleness <= version <= start:
                out.stale += 1
                continue
            out.groups[p] = KeptGroup(p, version, group[0].adapter, group)
    out.found = len(out.groups)
    if out.found or out.stale:
        log.info("resume of %s at step %d: %d finished group(s) of untrained steps kept (%d rollouts); %d stale "
                 "group(s) dropped (sampled outside %d version(s) of step %d) and sampled again", run_id, start,
                 out.found, sum(len(g.rollouts) for g in out.groups.values()), out.stale, max_staleness, start)
    return out


def _newest_attempt(rows: list[Rollout]) -> list[Rollout]:
    """The rows of the newest attempt at a group: those created since its newest `sample_index` 0 row."""
    starts = [r.created_at for r in rows if r.sample_index == 0]
    return [r for r in rows if r.created_at >= max(starts)] if starts else []


def _version(run_id: str, rollout: Rollout, by_adapter: bool) -> int | None:
    """The policy version `rollout` was created under, or None where it cannot be told."""
    if rollout.policy_version is not None:
        return rollout.policy_version
    return adapter_version(run_id, rollout.adapter) if by_adapter else None


def _task_id(task: Any) -> Any:
    return task.get("id") if isinstance(task, dict) else getattr(task, "id", None)
