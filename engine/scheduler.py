"""Continuous batching: one thread owns the model and runs a fixed loop.

    while running:
        run queued commands whose preconditions hold (load/unload adapter, update weights)
        admit waiting sequences (one left-padded prefill per adapter; they join its batch)
        one decode step for every adapter's batch (one forward pass each)
        retire finished or aborted rows

Requests join and leave the running batches between decode steps; the KV cache of each batch is a
`BatchKV`. Results go back to the asyncio side by `emit`, a callback that must be thread-safe.
Model work runs in this thread, not on the event loop, so the HTTP server stays responsive.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.kv import BatchKV
from engine.lora import AdapterSet
from engine.model import LoadedModel
from engine.protocol import CompletionState, SamplingParams, finish_json
from engine.sampling import sample_next

log = logging.getLogger("openforge.engine")
PREFILL_TOKEN_BUDGET = 16384  # padded prompt tokens in one prefill forward pass


@dataclass
class Sequence:
    """One /generate request inside the engine."""

    rid: str
    input_ids: list[int]
    params: SamplingParams
    adapter: str | None
    state: CompletionState
    generator: torch.Generator
    emit: Callable[[Sequence], None]  # thread-safe notification: state has new tokens or finished
    stream: bool = False  # notify on every token; otherwise only when finished
    aborted: bool = False
    created: float = field(default_factory=time.monotonic)
    next_token: int = -1  # sampled, not yet fed to the model
    position: int = 0  # tokens in this sequence's KV cache
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache


@dataclass
class _Command:
    fn: Callable[[], Any]
    ready: Callable[[], bool]  # run only when this holds (e.g. the adapter's batch has drained)
    future: concurrent.futures.Future
    exclusive: bool = False  # pause admissions until it has run with no sequence running


class Scheduler:
    """Owns the model; `submit` sequences and `call` commands from any thread."""

    def __init__(self, loaded: LoadedModel, *, max_batch_size: int = 16, prefix_cache_bytes: int = 0) -> None:
        self.m = loaded
        self.max_batch_size = max_batch_size
        self.adapters = AdapterSet(loaded.model)
        # transformers renamed `past_key_values` to `cache` (5.2x); pass whichever this model takes.
        params = inspect.signature(loaded.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.closing_adapters: set[str] = set()  # being unloaded: new requests are refused
        self._inbox: queue.Queue[Sequence | _Command | None] = queue.Queue()
        self._waiting: list[Sequence] = []
        self._batches: dict[str | None, tuple[list[Sequence], BatchKV]] = {}
        self._commands: list[_Command] = []
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self.steps = 0
        self.prefix_cache = None
        self.prefill_tokens = 0  # prompt tokens run through the model (cache hits excluded)
        self.cached_tokens = 0  # prompt tokens served from the prefix cache
        self._thread = threading.Thread(target=self._run, name="engine-scheduler", daemon=True)
        self._thread.start()

    # -- API (any thread) -------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def submit(self, seq: Sequence) -> None:
        self._inbox.put(seq)

    def call(self, fn: Callable[[], Any], ready: Callable[[], bool] = lambda: True, *,
             exclusive: bool = False) -> concurrent.futures.Future:
        """Run `fn` on the scheduler thread between steps, once `ready()` holds.

        `exclusive`: stop admitting sequences and run `fn` once the running ones have finished (a
        weight update must not change the model under a half-generated completion)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put(_Command(fn, (lambda: ready() and self._running() == 0) if exclusive else ready, fut, exclusive))
        return fut

    def uses_adapter(self, name: str) -> bool:
        """True while a waiting or running sequence uses `name` (scheduler thread only)."""
        rows = self._batches.get(name, ([], None))[0]
        return bool(rows) or any(s.adapter == name for s in self._waiting)

    def stats(self) -> dict[str, Any]:
        """Counters for /server_info's internal_states (read from any thread: plain ints)."""
        return {"prefill_tokens_computed": self.prefill_tokens, "cached_tokens": self.cached_tokens,
                "decode_steps": self.steps, "prefix_cache_bytes": 0}

    # -- commands (scheduler thread, through `call`) ----------------------------------------

    def unload_adapter(self, name: str) -> None:
        self.adapters.unload(name)

    def update_weights(self, load: Callable[[], None]) -> None:
        load()

    def flush_prefix_cache(self) -> None:
        pass

    def idle(self) -> bool:
        return not self._waiting and not any(rows for rows, _ in self._batches.values())

    def close(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._inbox.put(None)
        self._thread.join(timeout)

    # -- the loop (scheduler thread) --------------------------------------------------------

    def _run(self) -> None:
        try:
            with torch.inference_mode():
                while not self._stop.is_set():
                    self._drain_inbox(block=self.idle() and not self._commands)
                    self._run_commands()
                    self._admit()
                    for adapter in list(self._batches):
                        try:
                            self._decode(adapter)
                        except Exception as exc:  # noqa: BLE001 - fail this batch's requests, keep serving
                            log.exception("decode step failed")
                            self._abort_batch(adapter, f"decode failed: {type(exc).__name__}: {exc}")
                    self.steps += 1
        except BaseException as exc:  # noqa: BLE001 - every request must hear about it
            log.exception("engine scheduler died")
            self.error = exc
            self._fail_all(f"engine scheduler died: {type(exc).__name__}: {exc}")

    def _drain_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.05) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while item is not None:
            if isinstance(item, _Command):
                self._commands.append(item)
            else:
                self._waiting.append(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _run_commands(self) -> None:
        for cmd in list(self._commands):
            if not cmd.ready():
                continue
            self._commands.remove(cmd)
            try:
                cmd.future.set_result(cmd.fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                cmd.future.set_exception(exc)

    def _running(self) -> int:
        return sum(len(rows) for rows, _ in self._batches.values())

    def _admit(self) -> None:
        """Move waiting sequences into the running batches, prefilling those that share an adapter
        together (left-padded), within a padded-token budget per forward pass."""
        if any(c.exclusive for c in self._commands):
            return
        admitted: list[Sequence] = []
        while self._waiting and self._running() + len(admitted) < self.max_batch_size:
            seq = self._waiting.pop(0)
            if seq.aborted:
                self._finish(seq, finish_json("abort", message="aborted before it started"))
            elif seq.state.finish is not None:  # max_new_tokens == 0
                seq.emit(seq)
            elif seq.adapter is not None and seq.adapter not in self.adapters.paths:
                # Unloaded between the request's check and its admission.
                self._finish(seq, finish_json("abort", message=f"LoRA adapter {seq.adapter!r} was unloaded"))
            else:
                admitted.append(seq)
        for adapter in dict.fromkeys(s.adapter for s in admitted):
            group: list[Sequence] = []
            for seq in (s for s in admitted if s.adapter == adapter):
                longest = max([len(seq.input_ids)] + [len(s.input_ids) for s in group])
                if group and longest * (len(group) + 1) > PREFILL_TOKEN_BUDGET:
                    self._prefill_or_abort(group)
                    group = []
                group.append(seq)
            self._prefill_or_abort(group)

    def _prefill_or_abort(self, seqs: list[Sequence]) -> None:
        try:
            self._prefill(seqs)
        except Exception as exc:  # noqa: BLE001 - one bad request (e.g. out of memory) must not stop the engine
            if len(seqs) > 1:  # find the culprit: the others may well succeed alone
                for seq in seqs:
                    self._prefill_or_abort([seq])
                return
            log.exception("prefill of %s failed", seqs[0].rid)
            self._finish(seqs[0], finish_json("abort", message=f"prefill failed: {type(exc).__name__}: {exc}"))

    def _forward(self, adapter: str | None, cache: Any, **kwargs: Any) -> Any:
        """One forward pass; `cache` (a DynamicCache) is extended in place."""
        with self.adapters.activate(adapter):
            return self.m.model(**kwargs, **{self._cache_kw: cache}, use_cache=True)

    def _prefill(self, seqs: list[Sequence]) -> None:
        """One forward pass over the prompts of `seqs` (same adapter), left-padded; they join its batch."""
        from transformers import DynamicCache

        dev = self.m.device
        width = max(len(s.input_ids) for s in seqs)
        pads = [width - len(s.input_ids) for s in seqs]
        ids = torch.tensor([[0] * p + s.input_ids for p, s in zip(pads, seqs)], device=dev)
        extra: dict[str, Any] = {}
        if any(pads):  # pad id 0 is arbitrary: the mask hides it and positions skip it
            extra["attention_mask"] = torch.tensor([[0] * p + [1] * len(s.input_ids) for p, s in zip(pads, seqs)],
                                                   device=dev)
            extra["position_ids"] = torch.tensor([[0] * p + list(range(len(s.input_ids))) for p, s in zip(pads, seqs)],
                                                 device=dev)
        cache = DynamicCache(config=self.m.model.config)
        out = self._forward(seqs[0].adapter, cache, input_ids=ids, logits_to_keep=1, **extra)
        self.prefill_tokens += sum(len(s.input_ids) for s in seqs)
        for seq in seqs:
            seq.position = len(seq.input_ids)
        rows, kv = self._batches.setdefault(seqs[0].adapter, ([], BatchKV()))
        kv.join(cache, pads)
        rows.extend(seqs)
        self._take(out.logits[:, -1, :], seqs)

    def _take(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        tokens, logprobs = sample_next(logits, [s.params for s in seqs], [s.generator for s in seqs])
        for seq, token, lp in zip(seqs, tokens, logprobs):
            seq.next_token = token
            seq.state.append(token, lp)
            if seq.state.finish is None and seq.position + 1 >= self.m.context_length:
                seq.state.finish = finish_json("length", length=len(seq.state.output_ids))
            if seq.stream or seq.state.finish is not None:
                seq.emit(seq)

    def _decode(self, adapter: str | None) -> None:
        rows, kv = self._batches[adapter]
        self._retire(adapter)
        if not rows:
            del self._batches[adapter]
            return
        dev = self.m.device
        out = self._forward(
            adapter,
            kv.cache,
            input_ids=torch.tensor([[s.next_token] for s in rows], device=dev),
            attention_mask=kv.decode_mask(dev),
            position_ids=torch.tensor([[s.position] for s in rows], device=dev),
        )
        for s in rows:
            s.position += 1
        self._take(out.logits[:, -1, :], rows)
        self._retire(adapter)

    def _retire(self, adapter: str | None) -> None:
        rows, kv = self._batches[adapter]
        keep = [i for i, s in enumerate(rows) if s.state.finish is None and not s.aborted]
        if len(keep) == len(rows):
            return
        for s in rows:
            if s.aborted and s.state.finish is None:
                self._finish(s, finish_json("abort", message="the client went away"))
        kv.keep(keep)
        rows[:] = [rows[i] for i in keep]

    def _abort_batch(self, adapter: str | None, message: str) -> None:
        rows, _ = self._batches.pop(adapter, ([], None))
        for seq in rows:
            if seq.state.finish is None:
                self._finish(seq, finish_json("abort", message=message))

    def _finish(self, seq: Sequence, finish: dict[str, Any]) -> None:
        seq.state.finish = finish
        seq.emit(seq)

    def _fail_all(self, message: str) -> None:
        seqs = list(self._waiting) + [s for rows, _ in self._batches.values() for s in rows]
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Sequence):
                seqs.append(item)
            elif isinstance(item, _Command):
                self._commands.append(item)
        for seq in seqs:
            if seq.state.finish is None:
                self._finish(seq, finish_json("abort", message=message))
        for cmd in self._commands:
            cmd.future.set_exception(RuntimeError(message))
