"""Run under torchrun by tests/trainer/test_vl_dist.py: the real trainer loop (trainer/loop.py's `train`) on
the tiny VLM, rank 0 sampling with `ImageReplaySampler` (deterministic rows with images, written to
the store and the run's ImageStore) and rank 1 following it (trainer/distributed.py).

    python vl_dist_worker.py DB RUN MODEL HOME
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: tests.* imports

from openforge.trainer import distributed  # noqa: E402

# Square colour and image size per task; "text" has no image (step 1 only: a mixed batch). The
# sizes give different grids (4 to 30 image tokens), "two" holds two images in one row.
TASKS = [{"id": "red"}, {"id": "green"}, {"id": "two"}, {"id": "text"}]
IMAGES = {"red": [((220, 30, 30), (56, 56))], "green": [((30, 200, 40), (120, 80))],
          "two": [((30, 40, 220), (64, 200)), ((220, 30, 30), (84, 56))], "text": [((30, 200, 40), (56, 112))]}
STEPS, GROUP = 2, 4


def cfg():
    from openforge.config import TrainerConfig

    # micro_batch_tokens 100: each row is ~20-60 tokens, so a step packs into several micro-batches
    # and both ranks run some with images
    return TrainerConfig(steps=STEPS, tasks_per_step=len(TASKS), lr=2e-2, lora_r=4, lora_alpha=8,
                         micro_batch_tokens=100, loss_agg="seq-mean", seed=0, device="cpu")


class ImageReplaySampler:
    """Rows with images, a function of (task, step, sample index): prompt = the real chat template
    with the images' placeholder runs expanded by the processor, a random completion, reward by rng.
    Step 0: every task has its images; step 1: "text" is a text-only row (a mixed batch)."""

    def __init__(self, store, home: Path, model_dir: Path) -> None:
        from openforge.engine.vision import load_processor

        self.store, self.home, self.proc = store, Path(home), load_processor(model_dir)

    def sample(self, run_id: str, tasks: list, *, step: int, adapter: str | None) -> list:
        from openforge.image_store import ImageStore
        from openforge.store import Trajectory
        from tests.helpers.vl import _png, _prompt

        out = []
        for task in tasks:
            name = task["id"]
            images = [] if (name == "text" and step == 1) else [_png(c, size) for c, size in IMAGES[name]]
            if images:
                prompt = _prompt(self.proc, images, f"{name}: what colour is the square?")
            else:
                prompt = self.proc.tokenizer.encode(f"<|im_start|>user\nsay {name}<|im_end|>\n<|im_start|>assistant\n")
            shas = [ImageStore.for_run(self.home, run_id).put(b) for b in images] or None
            for k in range(GROUP):
                rng = random.Random(f"{name}-{step}-{k}")
                completion = [rng.randrange(3, 900) for _ in range(rng.randrange(2, 9))]
                r = self.store.create_rollout(run_id=run_id, task_id=name, step=step, sample_index=k,
                                              adapter=adapter, status="running")
                tokens = prompt + completion
                self.store.replace_trajectories(r.id, [Trajectory(
                    run_id=run_id, rollout_id=r.id, segment=0, token_ids=tokens,
                    loss_mask=[0] * len(prompt) + [1] * len(completion),
                    logprobs=[0.0] * len(prompt) + [-2.5] * len(completion), n_tokens=len(tokens), images=shas)])
                reward = float(k % 2 == 0) if k < 2 else float(rng.random() > 0.5)
                out.append(self.store.update_rollout(r.id, status="scored", reward=reward))
        return out


def main(db: str, run_id: str, model: str, home: str) -> None:
    if int(os.environ["RANK"]) != 0:
        distributed.follow()
        return
    from openforge.store import Store
    from openforge.trainer.loop import train

    store = Store(db)
    train(store, run_id, cfg(), model_path=model, tasks=TASKS, sampler=ImageReplaySampler(store, Path(home), Path(model)),
          home=Path(home))


if __name__ == "__main__":
    main(*sys.argv[1:])
