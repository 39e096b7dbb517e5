"""Run under torchrun by tests/trainer/test_trainer_torchrun.py: the real trainer loop (trainer/loop.py's
`train`) on every rank, rank 0 sampling with test_trainer's deterministic ReplaySampler and the
others following it (trainer/distributed.py). Each rank writes its pid to PIDS/rank-N.

    python dist_train_worker.py DB RUN MODEL HOME STEPS PIDS [--resume] [--slow]
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: tests.* imports

from openforge.trainer import distributed  # noqa: E402


def main(db: str, run_id: str, model: str, home: str, steps: str, pids: str, *flags: str) -> None:
    rank = int(os.environ["RANK"])
    Path(pids, f"rank-{rank}").write_text(str(os.getpid()))
    if rank != 0:
        distributed.follow()
        return
    from openforge.store import Store
    from tests.helpers.trainer import TASKS, ReplaySampler, _cfg
    from openforge.trainer.loop import train

    class Slow(ReplaySampler):
        def sample(self, *a, **kw):
            time.sleep(0.3)  # widen the window so a kill lands mid-run
            return super().sample(*a, **kw)

    store = Store(db)
    sampler = (Slow if "--slow" in flags else ReplaySampler)(store)
    train(store, run_id, _cfg(steps=int(steps)), model_path=model, tasks=TASKS, sampler=sampler, home=Path(home),
          resume="--resume" in flags)


if __name__ == "__main__":
    main(*sys.argv[1:])
