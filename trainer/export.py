"""`forge export RUN --format verl|jsonl`: the recorded trajectories, ready for another RL codebase.

One record per trajectory segment (a rollout whose history the harness rewrote has several):

    prompt_ids         tokens before the first sampled token (what veRL calls `prompts`)
    response_ids       every token after it: the model's tokens and, in multi-turn rollouts, the
                       tool outputs and later user turns between them (`responses`)
    response_mask      1 on tokens the engine sampled, 0 on the rest (veRL's multi-turn `response_mask`)
    rollout_log_probs  the engine's sampling logprob per response token (0.0 where the mask is 0)
    reward             the rollout's scalar reward; `token_level_scores` puts it on the last sampled
                       token, veRL's convention for outcome rewards
    uid                the GRPO group (task + step): veRL groups advantages by `uid`
    images             the sha256 ids of the images whose placeholder runs are in the tokens, in order
                       (files: runs/<run id>/images/<sha>.<ext>; parquet column `image_ids`)

The veRL parquet also carries the RLHFDataset columns (`data_source`, `prompt` as chat messages,
`ability`, `reward_model`, `extra_info`), so the same file can seed a fresh veRL run on the tasks.
Only rollouts that ended with a reward are exported; failed ones have nothing to learn from.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from openforge.errors import TrainerError
from openforge.store import Store
from openforge.trainer.data import is_usable


def iter_records(store: Store, run_id: str) -> Iterator[dict[str, Any]]:
    run = store.get_run(run_id)
    instructions = {t.task_id: t.instruction for t in store.list_tasks(run.id)}
    rollouts = {r.id: r for r in store.list_rollouts(run.id) if is_usable(r)}
    for traj in store.list_trajectories(run_id=run.id):
        r = rollouts.get(traj.rollout_id)
        if r is None:
            continue
        ids, mask, logp = traj.token_ids or [], traj.loss_mask or [], traj.logprobs or []
        if not (len(ids) == len(mask) == len(logp)):
            raise TrainerError(f"trajectory {r.id}/{traj.segment} is inconsistent; cannot export it")
        cut = mask.index(1) if 1 in mask else len(mask)
        resp_mask = mask[cut:]
        scores = [0.0] * len(resp_mask)
        if 1 in resp_mask:
            scores[len(resp_mask) - 1 - resp_mask[::-1].index(1)] = float(r.reward)  # type: ignore[arg-type]
        yield {
            "run_id": run.id, "rollout_id": r.id, "task_id": r.task_id, "step": r.step,
            "sample_index": r.sample_index, "segment": traj.segment, "uid": f"{r.task_id}@{r.step}",
            "adapter": r.adapter, "harness": r.harness, "status": r.status, "reward": float(r.reward),  # type: ignore[arg-type]
            "instruction": instructions.get(r.task_id, ""),
            "prompt_ids": ids[:cut], "response_ids": ids[cut:], "response_mask": resp_mask,
            "rollout_log_probs": logp[cut:], "token_level_scores": scores, "images": traj.images or [],
        }


def export_jsonl(store: Store, run_id: str, out: str | Path) -> int:
    """Write one JSON object per line; returns the number of records."""
    n = 0
    with _open(out) as f:
        for rec in iter_records(store, run_id):
            f.write(json.dumps(rec) + "\n")
            n += 1
    return n


def export_verl(store: Store, run_id: str, out: str | Path) -> int:
    """Write a veRL-ready parquet file; returns the number of records."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for i, rec in enumerate(iter_records(store, run_id)):
        rows.append({
            "data_source": "openforge",
            "prompt": [{"role": "user", "content": rec["instruction"]}],
            "ability": "agent",
            "reward_model": {"style": "rule", "ground_truth": ""},
            "extra_info": {"index": i, "run_id": rec["run_id"], "rollout_id": rec["rollout_id"],
                           "task_id": rec["task_id"], "step": rec["step"], "segment": rec["segment"]},
            "uid": rec["uid"], "reward": rec["reward"],
            "prompts": rec["prompt_ids"], "responses": rec["response_ids"], "response_mask": rec["response_mask"],
            "rollout_log_probs": rec["rollout_log_probs"], "token_level_scores": rec["token_level_scores"],
            "image_ids": rec["images"],
        })
    schema = pa.schema([
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        ("extra_info", pa.struct([("index", pa.int64()), ("run_id", pa.string()), ("rollout_id", pa.string()),
                                  ("task_id", pa.string()), ("step", pa.int64()), ("segment", pa.int64())])),
        ("uid", pa.string()), ("reward", pa.float64()),
        ("prompts", pa.list_(pa.int32())), ("responses", pa.list_(pa.int32())),
        ("response_mask", pa.list_(pa.int8())), ("rollout_log_probs", pa.list_(pa.float32())),
        ("token_level_scores", pa.list_(pa.float32())), ("image_ids", pa.list_(pa.string())),
    ])
    path = output_file(out)
    try:
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), str(path))
    except OSError as exc:
        raise TrainerError(f"cannot write {path}: {exc}") from None
    return len(rows)


def output_file(out: str | Path) -> Path:
    path = Path(out).expanduser()
    if path.is_dir():
        raise TrainerError(f"--out {path} is a directory; give a file name")
    if not path.parent.is_dir():
        raise TrainerError(f"--out: the folder {path.parent} does not exist")
    return path


def _open(out: str | Path):  # -> TextIO
    path = output_file(out)
    try:
        return path.open("w", encoding="utf-8")
    except OSError as exc:
        raise TrainerError(f"cannot write {path}: {exc}") from None
