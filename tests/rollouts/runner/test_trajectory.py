"""Trajectory assembly (rollouts/runner/trajectory.py): extension, history rewrites, retries, interleaved conversations."""

from __future__ import annotations


from openforge.store import Call
from openforge.rollouts.runner.trajectory import assemble_calls, assemble_rollout


def call(i: int, prompt: list[int], completion: list[int], images: list[str] | None = None) -> Call:
    return Call(id=i, run_id="run", rollout_id="ro", seq=i, status="ok", prompt_ids=prompt,
                completion_ids=completion, logprobs=[-0.1 * (k + 1) for k in range(len(completion))], images=images)


def test_extending_calls_merge_with_masks_and_logprobs_aligned():
    segs, stats = assemble_calls([call(1, [1, 2], [3, 4]), call(2, [1, 2, 3, 4, 5], [6])])
    assert (stats["n_segments"], stats["n_extends"]) == (1, 1)
    s = segs[0]
    assert s.tokens == [1, 2, 3, 4, 5, 6] and s.mask == [0, 0, 1, 1, 0, 1]
    assert s.logprobs == [0.0, 0.0, -0.1, -0.2, 0.0, -0.1] and s.call_ids == [1, 2]


def test_rewrite_starts_a_segment_and_subagents_interleave():
    main0, sub0 = call(1, [1, 2], [3]), call(2, [9, 9], [8])
    main1, sub1 = call(3, [1, 2, 3, 4], [5]), call(4, [9, 9, 8, 7], [6])
    compacted = call(5, [1, 7], [2])  # the harness rewrote its history
    segs, stats = assemble_calls([main0, sub0, main1, sub1, compacted])
    assert stats["n_segments"] == 3 and stats["n_extends"] == 2
    assert [s.call_ids for s in segs] == [[1, 3], [2, 4], [5]]
    assert stats["n_sampled"] == 5


def test_a_retry_replaces_the_call_it_repeats():
    segs, stats = assemble_calls([call(1, [1, 2], [3]), call(2, [1, 2], [4]), call(3, [1, 2, 4, 5], [6])])
    assert stats["n_retries"] == 1 and stats["n_segments"] == 1
    assert segs[0].tokens == [1, 2, 4, 5, 6] and segs[0].mask == [0, 0, 1, 0, 1] and segs[0].call_ids == [2, 3]


def test_the_same_placeholder_tokens_with_other_images_do_not_extend():
    """Screenshots expand to the same pad tokens: only the images' ids tell two prompts apart."""
    pad = [7, 9, 9, 9, 8]  # <|vision_start|> pads <|vision_end|>
    first = call(1, [1, *pad], [3], ["a" * 64])
    same = call(2, [1, *pad, 3, 4, *pad], [5], ["a" * 64, "b" * 64])  # the same first screenshot + a new one
    other = call(3, [1, *pad, 3, 4, *pad], [6], ["c" * 64, "b" * 64])  # same tokens, another first screenshot
    retry_other = call(4, [1, *pad], [2], ["c" * 64])  # the first prompt's tokens, another image: no retry
    segs, stats = assemble_calls([first, same, other, retry_other])
    assert [s.call_ids for s in segs] == [[1, 2], [3], [4]]
    assert [s.images for s in segs] == [["a" * 64, "b" * 64], ["c" * 64, "b" * 64], ["c" * 64]]
    assert stats["n_retries"] == 0 and stats["n_extends"] == 1


def test_assemble_rollout_writes_rows_and_counts(store):
    run = store.create_run(kind="proxy")
    ro = store.create_rollout(run_id=run.id, task_id="t")
    for c in (call(0, [1], [2]), call(1, [1, 2, 3], [4]), call(2, [5], [6])):
        c.id, c.run_id, c.rollout_id = None, run.id, ro.id
        store.add_call(c)
    failed = call(3, [1, 2, 3, 4, 9], [9])
    failed.id, failed.run_id, failed.rollout_id, failed.status = None, run.id, ro.id, "error"
    store.add_call(failed)
    stats = assemble_rollout(store, ro.id)
    assert (stats["n_segments"], stats["n_extends"], stats["n_calls"]) == (2, 1, 3)
    rows = store.list_trajectories(rollout_ids=[ro.id])
    assert [r.token_ids for r in rows] == [[1, 2, 3, 4], [5, 6]]
    got = store.get_rollout(ro.id)
    assert (got.n_segments, got.n_extends, got.n_tokens) == (2, 1, 6)
    assemble_rollout(store, ro.id)  # again: replaces, does not duplicate
    assert len(store.list_trajectories(rollout_ids=[ro.id])) == 2
