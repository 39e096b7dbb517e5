"""A training process killed with SIGKILL at an arbitrary moment resumes with every step exactly once
and ends with the same weights as a run that was never interrupted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from openforge.store import Store
from tests.helpers.paths import REPO
from tests.helpers.trainer import TASKS, ReplaySampler, _cfg, _lora_state
from openforge.trainer.loop import train

CHILD = """
import sys, time
sys.path.insert(0, {root!r})
from openforge.store import Store
from tests.helpers.trainer import TASKS, ReplaySampler, _cfg
from openforge.trainer.loop import train

class Slow(ReplaySampler):
    def sample(self, *a, **kw):
        time.sleep(0.3)  # widen the window so the kill can land mid-step
        return super().sample(*a, **kw)

store = Store({db!r})
train(store, {run!r}, _cfg(steps=6), model_path={model!r}, tasks=TASKS, sampler=Slow(store), home=__import__("pathlib").Path({home!r}))
"""


def test_sigkill_mid_run_then_resume(store: Store, tiny_model: Path, forge_home: Path) -> None:
    run = store.create_run()
    code = CHILD.format(root=str(REPO), db=str(store.path),
                        run=run.id, model=str(tiny_model), home=str(forge_home))
    child = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "FORGE_HOME": str(forge_home)},
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not any(s.step >= 1 for s in store.list_train_steps(run.id)):
        assert child.poll() is None, child.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "the child trained no step in time"
        time.sleep(0.05)
    time.sleep(0.4)  # somewhere inside step 2 or 3: sampling, training or writing the checkpoint
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    done_before = [s.step for s in store.list_train_steps(run.id)]
    assert done_before and done_before == list(range(len(done_before))) and len(done_before) < 6

    assert store.mark_interrupted(alive=lambda pid: False) == [run.id]
    sampler = ReplaySampler(store)
    train(store, run.id, _cfg(steps=6), model_path=tiny_model, tasks=TASKS, sampler=sampler, home=forge_home,
          resume=True)
    assert [s.step for s in store.list_train_steps(run.id)] == [0, 1, 2, 3, 4, 5]
    assert sampler.calls[0][0] in (len(done_before), len(done_before) + 1)  # +1: killed after the checkpoint

    ref = store.create_run()
    train(store, ref.id, _cfg(steps=6), model_path=tiny_model, tasks=TASKS, sampler=ReplaySampler(store),
          home=forge_home)
    a, b = _lora_state(forge_home, ref.id, 5), _lora_state(forge_home, run.id, 5)
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
