"""Shared by the trainer tests: a fixed task set, a sampler that replays scripted rollouts into the store, a
small trainer config, and readers of what a step wrote."""

from __future__ import annotations

import random
from pathlib import Path
import threading
import time

import torch

from openforge.config import TrainerConfig
from openforge.store import Rollout, Store, Trajectory
from openforge.trainer.data import Sample
from openforge.store import Call, Store
from openforge.store import Rollout, Store


TASKS = [{"id": f"task-{i}"} for i in range(5)]


class ReplaySampler:
    """Writes deterministic trajectories (a function of task, step and sample index), as if replaying
    recorded rollouts: what resume must reproduce exactly. Optionally stops the run at a step."""

    def __init__(self, store: Store, group_size: int = 3, stop_at: int | None = None, segments: int = 1) -> None:
        self.store, self.group_size, self.stop_at, self.segments = store, group_size, stop_at, segments
        self.calls: list[tuple[int, list[str], str | None]] = []

    def sample(self, run_id: str, tasks: list, *, step: int, adapter: str | None) -> list[Rollout]:
        if step == self.stop_at:
            raise KeyboardInterrupt  # what SIGTERM/Ctrl-C does to the CLI
        self.calls.append((step, [t["id"] for t in tasks], adapter))
        out = []
        for task in tasks:
            for k in range(self.group_size):
                rng = random.Random(f"{task['id']}-{step}-{k}")
                r = self.store.create_rollout(run_id=run_id, task_id=task["id"], step=step, sample_index=k,
                                              adapter=adapter, status="running")
                rows = []
                for seg in range(self.segments):
                    prompt = [rng.randrange(3, 900) for _ in range(5)]
                    completion = [rng.randrange(3, 900) for _ in range(4)]
                    rows.append(Trajectory(run_id=run_id, rollout_id=r.id, segment=seg,
                                           token_ids=prompt + completion,
                                           loss_mask=[0] * 5 + [1] * 4,
                                           logprobs=[0.0] * 5 + [-3.0] * 4, n_tokens=9))
                self.store.replace_trajectories(r.id, rows)
                out.append(self.store.update_rollout(r.id, status="scored", reward=float(rng.random() > 0.5)))
        return out


def _cfg(**kw) -> TrainerConfig:
    base = dict(steps=4, tasks_per_step=2, lr=1e-2, lora_r=4, lora_alpha=8, micro_batch_tokens=32, seed=0)
    return TrainerConfig(**{**base, **kw})


def _lora_state(home: Path, run_id: str, step: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(home / "runs" / run_id / "adapters" / f"step-{step}" / "adapter_model.safetensors"))


def _samples(n: int, seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.randrange(6, 14)
        mask = [0] * 3 + [1] * (length - 3)
        out.append(Sample(f"r{i // 2}", "t", i % 2, [rng.randrange(3, 900) for _ in range(length)], mask,
                          [0.0] * 3 + [-5.0] * (length - 3), rng.choice([-1.0, 0.5, 1.0]), 0.0))
    return out


QA = [("What is 2+3?", "5"), ("What is 4+4?", "8"), ("What is 7-5?", "2"), ("What is 3*3?", "9"),
      ("What is 9-1?", "8")]


def record_teacher_run(store: Store, tiny_model: Path, *, rewards: list[float]) -> str:
    """A run whose rollouts each hold one re-tokenised call answering one question."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    run = store.create_run(kind="eval")
    for (question, answer), reward in zip(QA, rewards):
        rollout = store.create_rollout(run_id=run.id, task_id=question, status="running")
        msgs = [{"role": "user", "content": question}]
        prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        store.add_call(Call(run_id=run.id, rollout_id=rollout.id, status="ok", retokenized=True,
                            prompt_ids=tok.encode(prompt, add_special_tokens=False),
                            completion_ids=tok.encode(f"The answer is {answer}.<|im_end|>", add_special_tokens=False)))
        store.update_rollout(rollout.id, status="scored", reward=reward)
    return run.id


class _FixedLogits(torch.nn.Module):
    """A 'model' whose next-token logits are one learnable vector z at every position."""

    def __init__(self, z: list[float]) -> None:
        super().__init__()
        self.z = torch.nn.Parameter(torch.tensor(z))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int = 0, **_: object):
        from types import SimpleNamespace

        return SimpleNamespace(logits=self.z.expand(input_ids.shape[0], input_ids.shape[1], -1))


class TimedSampler(ReplaySampler):
    """ReplaySampler whose groups take a scripted time: `slow` tasks `factor` x longer, with jitter, so
    groups finish out of the order they started in."""

    def __init__(self, store: Store, *, base_s: float = 0.02, slow: tuple[str, ...] = (), factor: float = 10.0,
                 seed: int = 0) -> None:
        super().__init__(store)
        self.base_s, self.slow, self.factor = base_s, set(slow), factor
        self.rng, self.lock = random.Random(seed), threading.Lock()

    def sample(self, run_id: str, tasks: list, *, step: int, adapter: str | None) -> list[Rollout]:
        with self.lock:
            jitter = self.rng.uniform(0.5, 1.5)
        time.sleep(self.base_s * jitter * (self.factor if tasks[0]["id"] in self.slow else 1.0))
        with self.lock:  # the replayed rows are written under one lock: their order does not matter
            return super().sample(run_id, tasks, step=step, adapter=adapter)
