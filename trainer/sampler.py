"""Where the trainer's rollouts come from, and how adapters reach the engine.

`Sampler.sample(run_id, tasks, step=, adapter=)` returns finished Rollout rows whose trajectories are
in the store. Two implementations:

- `RolloutSampler`: production. The rollouts part's `RolloutRunner` runs real harnesses in sandboxes
  through the recording proxy; the proxy serves each rollout with `Rollout.adapter` as `lora_path`.
  A `CancelToken` stops it from another thread (the run's controller).
- `EngineSampler`: no harness, no proxy. Prompts (token ids) go straight to the engine's
  `/generate` and the reward is a Python function of the completion: synthetic tasks, the "it
  learns" test and the benchmark. It writes the same rows the proxy would (Rollout, Call, Trajectory).

The engine client is async and its HTTP pool belongs to one event loop, while the training loop is
plain synchronous PyTorch; `BackgroundLoop` runs one event loop in a thread for all of them.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any, Protocol, Sequence, TypeVar

from openforge.errors import EngineError, TrainerError
from openforge.store import Call, Rollout, Store, Trajectory, utcnow

T = TypeVar("T")
log = logging.getLogger("forge.sampler")


class BackgroundLoop:
    """One asyncio loop in a daemon thread; `run(coro)` blocks the caller until it is done."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="forge-trainer-io", daemon=True)
        self._thread.start()

    def submit(self, value: Awaitable[T] | T) -> Future:
        if not inspect.isawaitable(value):
            done: Future = Future()
            done.set_result(value)
            return done
        async def wrap() -> Any:
            return await value
        return asyncio.run_coroutine_threadsafe(wrap(), self.loop)

    def run(self, value: Awaitable[T] | T) -> T:
        return self.submit(value).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)


class Sampler(Protocol):
    def sample(self, run_id: str, tasks: Sequence[Any], *, step: int, adapter: str | None) -> list[Rollout]:
        """Run a group of rollouts per task with `adapter`; return them finished and assembled."""


class Cancelled(KeyboardInterrupt):
    """Sampling was cancelled: the run is stopping. A KeyboardInterrupt, so that `train()` records the
    run as `stopped` rather than `failed`."""


class StepFailed(TrainerError):
    """Every rollout of a step failed for infrastructure or harness reasons: there is nothing to learn
    from, and the next step would fail the same way."""

    def __init__(self, what: str, n: int, reason: str, count: int) -> None:
        self.n, self.reason, self.count = n, reason, count
        super().__init__(f"every rollout of {what} failed ({n}); the most frequent reason ({count} of {n}): {reason}")

    @classmethod
    def check(cls, what: str, rollouts: Sequence[Rollout]) -> None:
        """Raise when `rollouts` is not empty and every one of them is an infra/harness failure."""
        if rollouts and all(is_infra_failure(r) for r in rollouts):
            reason, count = failure_reasons(rollouts)[0]
            raise cls(what, len(rollouts), reason, count)


class CancelToken:
    """Cancels sampling from any thread: the step in flight (its asyncio task, so the runner's own
    cleanup - sandbox `stop()` in its `finally` blocks - runs before the sampler returns) and every
    later one."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._running: set[tuple[asyncio.AbstractEventLoop, asyncio.Task]] = set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self) -> None:
        with self._lock:
            self._event.set()
            running = list(self._running)
        for loop, task in running:
            loop.call_soon_threadsafe(task.cancel)

    def check(self) -> None:
        if self._event.is_set():
            raise Cancelled()

    async def guard(self, work: Awaitable[T]) -> T:
        """Await `work` as a task this token cancels."""
        task = asyncio.current_task()
        assert task is not None
        entry = (asyncio.get_running_loop(), task)
        with self._lock:
            if self._event.is_set():  # cancelled before this task existed to be cancelled
                if inspect.iscoroutine(work):
                    work.close()
                raise asyncio.CancelledError
            self._running.add(entry)
        try:
            return await work
        finally:
            with self._lock:
                self._running.discard(entry)


def is_infra_failure(rollout: Rollout) -> bool:
    """Failed for a reason that is not the policy's: the sandbox, the engine, the harness itself.
    (A row without a failure kind predates them: the runner marked only those `failed`.)"""
    if rollout.failure_kind is not None:
        return rollout.failure_kind in ("infra", "harness")
    return rollout.status == "failed"


def is_failure(rollout: Rollout) -> bool:
    """Ended without being scored normally: failed (any kind) or timed out."""
    return rollout.failure_kind is not None or rollout.status in ("failed", "timed_out")


def failure_reasons(rollouts: Sequence[Rollout], *, which: Callable[[Rollout], bool] = is_infra_failure
                    ) -> list[tuple[str, int]]:
    """The reasons of the failures among `rollouts` (by default the infra/harness ones), most frequent
    first. A reason is the first line of the rollout's error."""
    counts = Counter(((r.error or "").strip().splitlines() or ["no reason recorded"])[0][:300]
                     for r in rollouts if which(r))
    return counts.most_common()


class RolloutSampler:
    """The trainer's `Sampler` over a `RolloutRunner`: each task becomes a group of `group_size`
    rollout specs, run on `bridge`'s loop, cancellable from another thread through `cancel`.

    `before_step(step)` runs before each step's rollouts start (e.g. raise if the engine is gone).
    A step whose every rollout failed for infra or harness reasons raises `StepFailed`."""

    def __init__(self, runner: Any, bridge: BackgroundLoop, *, group_size: int, cancel: CancelToken | None = None,
                 before_step: Callable[[int], None] | None = None) -> None:
        self.runner, self.bridge, self.group_size = runner, bridge, group_size
        self.cancel = cancel or CancelToken()
        self.before_step = before_step

    def sample(self, run_id: str, tasks: Sequence[Any], *, step: int, adapter: str | None) -> list[Rollout]:
        from openforge.rollouts.runner.evaluate import eval_specs

        self.cancel.check()
        if self.before_step is not None:
            self.before_step(step)
        log.info("step %d: sampling %d task(s) x %d, adapter %s", step, len(tasks), self.group_size, adapter or "base")
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
        from openforge.images import ImageStore
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

    from openforge.images import image_format

    return f"data:image/{image_format(data)};base64," + base64.b64encode(data).decode()


class AdapterSync:
    """Hot-loads each new adapter into the engine under a new name and unloads old ones.

    The adapter of step N-1 stays loaded while N is being served: with one-step-off-policy overlap,
    rollouts that started with it may still be running."""

    def __init__(self, client: Any, bridge: BackgroundLoop, keep: int = 2) -> None:
        self.client, self.bridge, self.keep = client, bridge, keep
        self.loaded: list[str] = []

    def load(self, name: str, path: str) -> None:
        try:
            self.bridge.run(self.client.load_lora_adapter(name, path))
        except EngineError as first:
            # A long-lived engine (kind = "url") may hold this name from before a resume; SGLang
            # refuses to load a name twice, so replace it. Any other failure is the one reported.
            try:
                self.bridge.run(self.client.unload_lora_adapter(name))
            except EngineError:
                raise first from None
            self.bridge.run(self.client.load_lora_adapter(name, path))
        self.loaded.append(name)
        while len(self.loaded) > self.keep:
            self.bridge.run(self.client.unload_lora_adapter(self.loaded.pop(0)))

    def update_weights(self, path: str) -> None:
        """Full fine-tuning: the engine reloads its base weights from the saved model folder."""
        self.bridge.run(self.client.update_weights_from_disk(path))
