"""Where the trainer's rollouts come from.

`Sampler.sample(run_id, tasks, step=, adapter=)` returns finished Rollout rows whose trajectories are
in the store. Two implementations:

- `RolloutSampler`: production. The rollouts part's `RolloutRunner` runs real harnesses in sandboxes
  through the recording proxy; the proxy serves each rollout with `Rollout.adapter` as `lora_path`.
  A `CancelToken` stops it from another thread (the run's controller).
- `EngineSampler`: no harness, no proxy. Prompts (token ids) go straight to the engine's
  `/generate` and the reward is a Python function of the completion: synthetic tasks, the "it
  learns" test and the benchmark. It writes the same rows the proxy would (Rollout, Call, Trajectory).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any, Protocol, Sequence

from openforge.errors import TrainerError
from openforge.rollouts.runner.failures import PromptDoesNotFit, StepFailed
from openforge.store import Call, Rollout, Store, Trajectory, utcnow
from openforge.trainer.bridge import BackgroundLoop
from openforge.trainer.cancel import Cancelled, CancelToken

log = logging.getLogger("forge.sampler")


class Sampler(Protocol):
    def sample(self, run_id: str, tasks: Sequence[Any], *, step: int, adapter: str | None) -> list[Rollout]:
        """Run a group of rollouts per task with `adapter`; return them finished and assembled."""


class RolloutSampler:
    """The trainer's `Sampler` over a `RolloutRunner`: each task becomes a group of `group_size`
    rollout specs, run on `bridge`'s loop, cancellable from another thread through `cancel`.

    `before_step(step)` runs before each step's rollouts start (e.g. raise if the engine is gone).
    A step whose every rollout failed for infra or harness reasons raises `StepFailed`; one where most
    could not run the harness (its own prompt over the context) raises `PromptDoesNotFit`.

    With several `harnesses` (name -> weight, `HarnessConfig.weights()`), each group runs in one of
    them, dealt out over the run's groups by rollouts/runner/mix.py; a step's groups are numbered
    from step x tasks, so a step sampled early (overlap) or again (resume) gets the same harnesses."""

    def __init__(self, runner: Any, bridge: BackgroundLoop, *, group_size: int, cancel: CancelToken | None = None,
                 before_step: Callable[[int], None] | None = None,
                 harnesses: Mapping[str, float] | None = None) -> None:
        self.runner, self.bridge, self.group_size = runner, bridge, group_size
        self.harnesses = dict(harnesses or {})
        self.cancel = cancel or CancelToken()
        self.before_step = before_step

    def sample(self, run_id: str, tasks: Sequence[Any], *, step: int, adapter: str | None) -> list[Rollout]:
        from openforge.rollouts.runner.evaluate import eval_specs, group_specs
        from openforge.rollouts.runner.mix import group_harnesses

        self.cancel.check()
        if self.before_step is not None:
            self.before_step(step)
        log.info("step %d: sampling %d task(s) x %d, adapter %s", step, len(tasks), self.group_size, adapter or "base")
        if len(self.harnesses) > 1:
            names = group_harnesses(self.harnesses, step * len(tasks), len(tasks))
            specs = group_specs(list(tasks), self.group_size, names)
        else:
            specs = eval_specs(list(tasks), self.group_size)  # a task's group starts (and ends) together
        future = self.bridge.submit(self.cancel.guard(self.runner.run(run_id, specs, step=step, adapter=adapter)))
        try:
            rollouts = list(future.result())
        except BaseException:
            if self.cancel.cancelled:
                raise Cancelled() from None
            raise
        self.cancel.check()
        scored = [r.reward for r in rollouts if r.reward is not None]
        log.info("step %d: %d rollouts, %d scored, mean reward %s", step, len(rollouts), len(scored),
                 f"{sum(scored) / len(scored):.3f}" if scored else "-")
        PromptDoesNotFit.check(f"step {step}", rollouts)  # the harness's prompt over the context: fix, then rerun
        StepFailed.check(f"step {step}", rollouts)
        return rollouts


RewardFn = Callable[[Any, list[int]], float]


class EngineSampler:
    """G completions per prompt straight from the engine, scored by `reward_fn(task, completion_ids)`.

    A task is a dict with `id` and `prompt_ids` (the exact tokens sent), or any object with those
    attributes. The recorded logprobs are the engine's, exactly as the proxy records them.

    A task with `images` (encoded image bytes, one per placeholder run already expanded in
    `prompt_ids`, engine/vision.py) is sent with SGLang's `image_data`; its images are stored in the
    run's ImageStore under `home` and listed on the call and trajectory rows, as the proxy does."""

    def __init__(self, client: Any, store: Store, bridge: BackgroundLoop, *, reward_fn: RewardFn,
                 group_size: int = 4, max_new_tokens: int = 16, temperature: float = 1.0,
                 stop_token_ids: Sequence[int] = (), ignore_eos: bool = False, home: Any = None) -> None:
        self.client, self.store, self.bridge = client, store, bridge
        self.home = home
        self.reward_fn = reward_fn
        self.group_size = group_size
        self.params: dict[str, Any] = {"max_new_tokens": max_new_tokens, "temperature": temperature}
        if stop_token_ids:
            self.params["stop_token_ids"] = list(stop_token_ids)
        if ignore_eos:  # fixed-length completions (benchmarks)
            self.params["ignore_eos"] = True

    def sample(self, run_id: str, tasks: Sequence[Any], *, step: int, adapter: str | None) -> list[Rollout]:
        jobs = []
        for task in tasks:
            for k in range(self.group_size):
                rollout = self.store.create_rollout(run_id=run_id, task_id=_get(task, "id"), step=step,
                                                    sample_index=k, harness="direct", adapter=adapter,
                                                    status="running")
                jobs.append((task, rollout))

        def send(task: Any) -> Any:
            images = _images(task)
            if not images:
                return self.client.generate(list(_get(task, "prompt_ids")), self.params, lora_path=adapter)
            return self.client.generate(list(_get(task, "prompt_ids")), self.params, lora_path=adapter,
                                        image_data=[_data_url(b) for b in images])

        async def go() -> list[Any]:
            return await asyncio.gather(*[send(t) for t, _ in jobs], return_exceptions=True)

        outputs = self.bridge.run(go())
        return [self._record(run_id, task, rollout, out, adapter) for (task, rollout), out in zip(jobs, outputs)]

    def _record(self, run_id: str, task: Any, rollout: Rollout, out: Any, adapter: str | None) -> Rollout:
        if isinstance(out, BaseException):  # the engine failed this one: infrastructure, not data
            return self.store.update_rollout(rollout.id, status="failed", error=f"{type(out).__name__}: {out}")
        prompt = list(_get(task, "prompt_ids"))
        completion, logprobs = list(out.output_ids), list(out.logprobs)
        if len(logprobs) != len(completion):
            raise TrainerError(f"engine returned {len(completion)} tokens but {len(logprobs)} logprobs")
        image_ids = self._store_images(run_id, _images(task))
        call = self.store.add_call(Call(
            run_id=run_id, rollout_id=rollout.id, seq=0, api="sglang_generate", adapter=adapter, status="ok",
            request_json={"sampling_params": self.params}, prompt_ids=prompt,
            temperature=self.params.get("temperature"),  # the trainer scores each token at its call's temperature
            completion_ids=completion, logprobs=logprobs, finish_reason=out.finish_reason,
            prompt_tokens=len(prompt), completion_tokens=len(completion), ended_at=utcnow(), images=image_ids,
        ))
        tokens = prompt + completion
        self.store.replace_trajectories(rollout.id, [Trajectory(
            run_id=run_id, rollout_id=rollout.id, segment=0, token_ids=tokens,
            loss_mask=[0] * len(prompt) + [1] * len(completion),
            logprobs=[0.0] * len(prompt) + logprobs, call_ids=[call.id],
            n_tokens=len(tokens), images=image_ids,
        )])
        reward = float(self.reward_fn(task, completion))
        return self.store.update_rollout(rollout.id, status="scored", reward=reward, n_calls=1,
                                         n_tokens=len(tokens), n_segments=1)


    def _store_images(self, run_id: str, images: list[bytes]) -> list[str] | None:
        if not images:
            return None
        from openforge.image_store import ImageStore
        from openforge.paths import forge_home

        store = ImageStore.for_run(self.home or forge_home(), run_id)
        return [store.put(data) for data in images]


def _get(task: Any, key: str) -> Any:
    return task[key] if isinstance(task, dict) else getattr(task, key)


def _images(task: Any) -> list[bytes]:
    """A task's image bytes (none for a text task)."""
    images = task.get("images") if isinstance(task, dict) else getattr(task, "images", None)
    return list(images or [])


def _data_url(data: bytes) -> str:
    import base64

    from openforge.image_store import image_format

    return f"data:image/{image_format(data)};base64," + base64.b64encode(data).decode()
