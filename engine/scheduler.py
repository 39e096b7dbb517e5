"""Continuous batching: one thread owns the model and runs a fixed loop.

    while running:
        run queued commands whose preconditions hold (load/unload adapter, update weights)
        admit waiting sequences: a prompt whose prefix is in the prefix cache is prefilled alone
            from that KV (only its new tokens computed); the others, one left-padded prefill per
            adapter; every prefilled prompt's KV goes into the cache; they join the adapter's batch
        one chunk of the oldest long prompt (chunked prefill, as SGLang's --chunked-prefill-size)
        one decode step for every adapter's batch (one forward pass each)
        retire finished or aborted rows (a finished row's prompt + answer KV goes into the cache)

Requests join and leave the running batches between decode steps; the KV cache of each batch is a
`BatchKV`. A prompt with more than PREFILL_CHUNK tokens not in the prefix cache (a real harness
sends ~20-50k) is computed PREFILL_CHUNK tokens per loop turn, oldest first, each chunk's KV put in
the prefix cache as it is made. So the loop never stalls for a whole long prefill: running batches
keep decoding, an adapter load waits one chunk, not one prompt, an abort (the client left) takes
effect at the next chunk, and N requests that share a long prefix (a GRPO group's first calls)
compute it once: the next one in line finds it cached, chunk by chunk. Results go back to the asyncio side by `emit`, a callback that must be thread-safe.

A vision-language model (Qwen2-VL): a sequence with images carries `mm` (engine/multimodal.py). Its
prefix-cache key has each image's placeholder tokens replaced by the image's hash (KV of one image
is never served for another behind the same placeholders); every forward pass gets the M-RoPE
positions of its tokens and the pixel values of exactly the images whose runs it computes. An
image's run is never split: a chunk of a long prompt ends after a run it would cut, and a cached
prefix that ends inside a run is cut back to the run's start. Decode positions are per row
(`position + rope_delta`: each sequence has its own delta, so a batch mixes them freely).
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

from openforge.engine.kv import BatchKV
from openforge.engine.lora import AdapterSet
from openforge.engine.model import LoadedModel
from openforge.engine.prefix_cache import PrefixCache
from openforge.engine.protocol import CompletionState, SamplingParams, finish_json
from openforge.engine.sampling import sample_next

log = logging.getLogger("openforge.engine")
PREFILL_TOKEN_BUDGET = 16384  # padded prompt tokens in one prefill forward pass
# Shorter cached prefixes are not worth a forward pass of their own: batched with the other new
# prompts, the few shared tokens cost less than a separate prefill.
MIN_CACHED_PREFIX = 64
PREFILL_CHUNK = 4096  # prompt tokens one loop turn computes for a long prompt


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
    kv: Any = None  # a long prompt's DynamicCache while it is prefilled chunk by chunk
    mm: Any = None  # engine.multimodal.ImagePrompt: the prompt's images (None: text only)

    @property
    def key_ids(self) -> list[int]:
        """The prompt as the prefix cache keys it: images as their hashes, not their placeholders."""
        return self.mm.key_ids if self.mm is not None else self.input_ids

    @property
    def rope_delta(self) -> int:
        return self.mm.rope_delta if self.mm is not None else 0


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
        self.mrope = getattr(loaded, "vision", None) is not None  # positions are [3, B, T] (Qwen2-VL)
        self.max_batch_size = max_batch_size
        self.adapters = AdapterSet(loaded.model)
        # transformers renamed `past_key_values` to `cache` (5.2x); pass whichever this model takes.
        params = inspect.signature(loaded.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.closing_adapters: set[str] = set()  # being unloaded: new requests are refused
        self._inbox: queue.Queue[Sequence | _Command | None] = queue.Queue()
        self._waiting: list[Sequence] = []
        self._prefilling: list[Sequence] = []  # long prompts being prefilled a chunk at a time, oldest first
        self._batches: dict[str | None, tuple[list[Sequence], BatchKV]] = {}
        self._commands: list[_Command] = []
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self.steps = 0
        self.prefix_cache = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
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
        self._inbox.put(_Command(fn, (lambda: ready() and self._running() + len(self._prefilling) == 0)
                                 if exclusive else ready, fut, exclusive))
        return fut

    def uses_adapter(self, name: str) -> bool:
        """True while a waiting or running sequence uses `name` (scheduler thread only)."""
        rows = self._batches.get(name, ([], None))[0]
        return bool(rows) or any(s.adapter == name for s in self._waiting + self._prefilling)

    def stats(self) -> dict[str, Any]:
        """Counters for /server_info's internal_states (read from any thread: plain ints)."""
        cache = self.prefix_cache
        return {"prefill_tokens_computed": self.prefill_tokens, "cached_tokens": self.cached_tokens,
                "decode_steps": self.steps, "prefix_cache_bytes": cache.bytes if cache else 0,
                "prefix_cache_budget_bytes": cache.budget_bytes if cache else 0,
                "prefix_cache_evictions": cache.evictions if cache else 0}

    # -- commands (scheduler thread, through `call`) ----------------------------------------

    def unload_adapter(self, name: str) -> None:
        self.adapters.unload(name)
        if self.prefix_cache is not None:
            self.prefix_cache.drop_adapter(name)

    def update_weights(self, load: Callable[[], None]) -> None:
        try:
            load()
        finally:  # even a failed copy may have changed some weights: no KV of the old ones survives
            self.flush_prefix_cache()

    def flush_prefix_cache(self) -> None:
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def idle(self) -> bool:
        return not self._waiting and not self._prefilling and not any(rows for rows, _ in self._batches.values())

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
                    self._prefill_chunk()
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
        while self._waiting and self._running() + len(self._prefilling) + len(admitted) < self.max_batch_size:
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
                head = seq.key_ids[:MIN_CACHED_PREFIX]
                if group and self.prefix_cache is not None and len(head) == MIN_CACHED_PREFIX \
                        and any(s.key_ids[:MIN_CACHED_PREFIX] == head for s in group):
                    # It would recompute a prefix this group is about to cache: prefill the group first.
                    self._prefill_or_abort(group)
                    group = []
                if self._prefill_from_cache(seq):
                    continue
                if len(seq.input_ids) > PREFILL_CHUNK:
                    self._prefilling.append(seq)
                    continue
                longest = max([len(seq.input_ids)] + [len(s.input_ids) for s in group])
                if group and longest * (len(group) + 1) > PREFILL_TOKEN_BUDGET:
                    self._prefill_or_abort(group)
                    group = []
                group.append(seq)
            self._prefill_or_abort(group)

    def _cache_key(self, adapter: str | None) -> Any:
        return None if adapter is None else (adapter, self.adapters.paths.get(adapter))

    def _positions(self, seq: Sequence, start: int, stop: int) -> torch.Tensor:
        """Position ids of `seq`'s tokens [start, stop): [1, n], or [3, 1, n] for an M-RoPE model."""
        dev = self.m.device
        if seq.mm is not None:
            return seq.mm.positions[:, start:stop].to(dev).unsqueeze(1)
        pos = torch.arange(start, stop, device=dev).unsqueeze(0)
        return pos.expand(3, 1, -1) if self.mrope else pos

    def _vision(self, seq: Sequence, start: int, stop: int) -> dict[str, Any]:
        """pixel_values / image_grid_thw of the images inside [start, stop) of `seq`'s prompt."""
        if seq.mm is None:
            return {}
        return {k: v.to(self.m.device) for k, v in seq.mm.vision_inputs(start, stop).items()}

    def _cached_prefix(self, seq: Sequence, ids: list[int]) -> tuple[int, Any]:
        """The prefix cache's longest match of `ids` (key ids), cut back so no image run is split."""
        n, kv = self.prefix_cache.match(self._cache_key(seq.adapter), ids)
        if seq.mm is not None and n:
            cut = seq.mm.safe_prefix(n)
            if cut < n:
                n, kv = cut, [(k[..., :cut, :], v[..., :cut, :]) for k, v in kv] if cut else None
        return n, kv

    def _remember(self, adapter: str | None, ids: list[int], cache: Any, row: int, pad: int) -> None:
        """Put row `row` of `cache` (its first `pad` columns padding) into the prefix cache as `ids`."""
        if self.prefix_cache is None:
            return
        kv = [(layer.keys[row:row + 1, :, pad:, :], layer.values[row:row + 1, :, pad:, :]) for layer in cache.layers]
        if kv[0][0].shape[-2] == len(ids):
            self.prefix_cache.insert(self._cache_key(adapter), ids, kv)

    def _prefill_from_cache(self, seq: Sequence) -> bool:
        """Prefill `seq` from a cached prefix of its prompt; False when none is long enough."""
        if self.prefix_cache is None:
            return False
        # At least the last prompt token is computed: its logits give the first output token.
        n, kv = self._cached_prefix(seq, seq.key_ids[:-1])
        if n < MIN_CACHED_PREFIX or len(seq.input_ids) - n > PREFILL_CHUNK:
            return False  # a long rest is prefilled a chunk at a time (it re-matches the cache first)
        try:
            self._prefill_cached(seq, n, kv)
        except Exception as exc:  # noqa: BLE001 - one bad request must not stop the engine
            log.exception("prefill of %s failed", seq.rid)
            self._finish(seq, finish_json("abort", message=f"prefill failed: {type(exc).__name__}: {exc}"))
        return True

    def _prefill_cached(self, seq: Sequence, n: int, kv: Any) -> None:
        """One forward pass over the prompt's tokens after its `n` cached ones, on top of their KV."""
        from transformers import DynamicCache

        dev = self.m.device
        cache = DynamicCache(config=self.m.model.config)
        for i, (k, v) in enumerate(kv):
            cache.update(k, v, i)  # copies: the cached tensors are never written to
        ids = seq.input_ids
        out = self._forward(seq.adapter, cache, input_ids=torch.tensor([ids[n:]], device=dev),
                            position_ids=self._positions(seq, n, len(ids)), logits_to_keep=1,
                            **self._vision(seq, n, len(ids)))
        self.prefill_tokens += len(ids) - n
        self.cached_tokens += n
        seq.position, seq.cached_tokens = len(ids), n
        self._remember(seq.adapter, seq.key_ids, cache, 0, 0)
        rows, batch = self._batches.setdefault(seq.adapter, ([], BatchKV()))
        batch.join(cache, [0])
        rows.append(seq)
        self._take(out.logits[:, -1, :], [seq])

    def _prefill_chunk(self) -> None:
        """Compute the next PREFILL_CHUNK prompt tokens of the oldest long prompt (see the module doc)."""
        if not self._prefilling:
            return
        seq = self._prefilling[0]
        if seq.aborted:
            self._prefilling.pop(0)
            self._finish(seq, finish_json("abort", message="the client went away"))
            return
        try:
            done = self._extend_prefill(seq)
        except Exception as exc:  # noqa: BLE001 - one bad request (e.g. out of memory) must not stop the engine
            log.exception("prefill of %s failed", seq.rid)
            self._prefilling.pop(0)
            self._finish(seq, finish_json("abort", message=f"prefill failed: {type(exc).__name__}: {exc}"))
            return
        if done:
            self._prefilling.pop(0)

    def _extend_prefill(self, seq: Sequence) -> bool:
        """One chunk of `seq`'s prompt on top of its KV so far (first taking whatever more of it the
        prefix cache now holds); True once the whole prompt is in and `seq` has joined its batch."""
        from transformers import DynamicCache

        ids, dev = seq.input_ids, self.m.device
        if seq.kv is None:
            seq.kv = DynamicCache(config=self.m.model.config)
        if self.prefix_cache is not None:  # the one ahead in line may have cached more of this prompt
            n, kv = self._cached_prefix(seq, seq.key_ids[:-1])
            if n > seq.position:
                for i, (k, v) in enumerate(kv):
                    seq.kv.update(k[..., seq.position:n, :], v[..., seq.position:n, :], i)
                seq.cached_tokens += n - seq.position
                self.cached_tokens += n - seq.position
                seq.position = n
        stop = min(seq.position + PREFILL_CHUNK, len(ids))
        if seq.mm is not None:
            stop = seq.mm.chunk_end(stop)
        out = self._forward(seq.adapter, seq.kv, input_ids=torch.tensor([ids[seq.position:stop]], device=dev),
                            position_ids=self._positions(seq, seq.position, stop), logits_to_keep=1,
                            **self._vision(seq, seq.position, stop))
        self.prefill_tokens += stop - seq.position
        seq.position = stop
        self._remember(seq.adapter, seq.key_ids[:stop], seq.kv, 0, 0)
        if stop < len(ids):
            return False
        cache, seq.kv = seq.kv, None
        rows, batch = self._batches.setdefault(seq.adapter, ([], BatchKV()))
        batch.join(cache, [0])
        rows.append(seq)
        self._take(out.logits[:, -1, :], [seq])
        return True

    def _prefill_or_abort(self, seqs: list[Sequence]) -> None:
        if not seqs:  # every one was served from the prefix cache
            return
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
        if self.mrope:  # each row's own M-RoPE positions (pads at 0, hidden by the mask)
            pos = torch.zeros(3, len(seqs), width, dtype=torch.long, device=dev)
            for row, (seq, pad) in enumerate(zip(seqs, pads)):
                pos[:, row, pad:] = self._positions(seq, 0, len(seq.input_ids))[:, 0, :]
            extra["position_ids"] = pos
            # The images of every row, in row order: the model fills placeholder tokens row-major.
            vision = [self._vision(s, 0, len(s.input_ids)) for s in seqs]
            vision = [v for v in vision if v]
            if vision:
                extra["pixel_values"] = torch.cat([v["pixel_values"] for v in vision])
                extra["image_grid_thw"] = torch.cat([v["image_grid_thw"] for v in vision])
        cache = DynamicCache(config=self.m.model.config)
        out = self._forward(seqs[0].adapter, cache, input_ids=ids, logits_to_keep=1, **extra)
        self.prefill_tokens += sum(len(s.input_ids) for s in seqs)
        for row, (seq, pad) in enumerate(zip(seqs, pads)):
            seq.position = len(seq.input_ids)
            self._remember(seq.adapter, seq.key_ids, cache, row, pad)
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
            # After the prompt every M-RoPE axis is position + the row's rope delta (0 for text).
            position_ids=torch.tensor([[s.position + s.rope_delta] for s in rows], device=dev),
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
        for i, s in enumerate(rows):
            if s.aborted and s.state.finish is None:
                self._finish(s, finish_json("abort", message="the client went away"))
            elif s.state.finish is not None and s.state.finish["type"] != "abort":
                # Prompt + answer: the next turn of this conversation starts with exactly these ids.
                self._remember(adapter, (s.key_ids + s.state.output_ids)[:s.position], kv.cache, i, kv.pads[i])
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
        seqs = list(self._waiting) + self._prefilling + [s for rows, _ in self._batches.values() for s in rows]
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
